"""``lit-agentrl plan``: the memory calculator against hand arithmetic (Qwen3-8B) and real tensors on CPU."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from support import REPO_ROOT
from transformers import Qwen3Config, Qwen3ForCausalLM

from lit_agentrl.cli import inputs_from_config, main
from lit_agentrl.plan import (
    GB,
    SGLANG_DEFAULT_MEM_FRACTION,
    PlanInputs,
    model_shapes,
    outside_layers_activation_bytes_per_token,
    plan_memory,
)

CONFIG_8B = REPO_ROOT / "configs" / "qwen3_8b_math_agent.yaml"
CONFIG_DISAGG = REPO_ROOT / "configs" / "qwen3_8b_math_agent_disagg.yaml"
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
}
SMALL = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def qwen3_8b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3-8b")
    (path / "config.json").write_text(json.dumps(QWEN3_8B))
    return path


def config_8b(model_dir: Path, **trainer: int) -> dict:
    config = yaml.safe_load(CONFIG_8B.read_text())
    config["model"]["model_path"] = str(model_dir)
    if "devices" in trainer:
        config["trainer"]["devices"] = trainer["devices"]
        config["trainer"]["strategy"]["init_args"]["data_parallel_size"] = trainer["devices"]
    return config


def small_inputs(**overrides) -> PlanInputs:
    model = Qwen3ForCausalLM(Qwen3Config(**SMALL))
    layers = [sum(p.numel() for p in layer.parameters()) for layer in model.model.layers]
    total = sum(p.numel() for p in model.parameters())
    fields = dict(
        num_params=total,
        layer_params=max(layers),
        root_params=total - sum(layers),
        hidden_size=SMALL["hidden_size"],
        num_layers=SMALL["num_hidden_layers"],
        vocab_size=SMALL["vocab_size"],
        num_heads=SMALL["num_attention_heads"],
        num_kv_heads=SMALL["num_key_value_heads"],
        head_dim=SMALL["head_dim"],
        intermediate_size=SMALL["intermediate_size"],
    )
    return PlanInputs(**{**fields, **overrides})


# ---------------------------------------------------------------------------------------------------- Qwen3-8B


def test_qwen3_8b_parameters_and_sharded_states_by_hand(qwen3_8b_dir: Path):
    shapes = model_shapes(str(qwen3_8b_dir))
    h, i, kv = 4096, 12288, 8 * 128
    layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h + 2 * 128  # q,o; k,v; gate,up,down; 2 norms; q/k norms
    assert shapes.layer_params == layer
    assert shapes.num_params == 36 * layer + 2 * 151936 * h + h  # untied embeddings and head, final norm
    assert shapes.num_params == pytest.approx(8.19e9, rel=0.001)
    plan = plan_memory(inputs_from_config(config_8b(qwen3_8b_dir)))
    f = plan.figures
    states = f["parameters (fp32, sharded)"] + f["gradients (fp32, sharded)"] + f["AdamW states (2 x fp32, sharded)"]
    assert states == pytest.approx(16.4 * GB, rel=0.01)  # 16 bytes x 8.19e9 / 8
    assert plan.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    assert f["SGLang weights"] == 2 * shapes.num_params
    assert f["SGLang KV cache"] == int(0.85 * 80 * GB) - 2 * shapes.num_params
    assert plan.worst_case_tokens == 64 // 8 * 32 * (1024 + 2048)
    # rank 0 reads one fp32 copy and broadcasts the shards, even with a reference model
    assert f["host memory at load, per node"] == 4 * shapes.num_params
    with_reference = plan_memory(replace(inputs_from_config(config_8b(qwen3_8b_dir)), kl_coef=0.1))
    assert with_reference.figures["host memory at load, per node"] == 4 * shapes.num_params


def test_qwen3_8b_on_8_gpus_fits(qwen3_8b_dir: Path):
    """Colocated, as the seed: SGLang takes 0.85 of the GPU while it generates, the trainer's sharded parameters and
    AdamW states (12.3 GB) waiting in host memory; SGLang is released while the trainer trains."""
    plan = plan_memory(inputs_from_config(config_8b(qwen3_8b_dir)))
    p = plan.phases
    assert 30 * GB < p["training"] < 40 * GB  # chunked log-probs: 3.1 GB for the head instead of 34.9 GB
    assert p["optimizer step"] < p["training"]
    assert p["generation"] == pytest.approx(0.85 * 80 * GB, rel=0.001)  # SGLang alone
    # The sync: fp32 parameter shards (4.1 GB), SGLang's bf16 weights (16.4 GB), a 512 MiB bucket and its flattened
    # copy, and the head gathered in fp32 and cast to bf16 (6 x 151936 x 4096 = 3.7 GB).
    assert p["weight sync"] == pytest.approx(4.1 * GB + 16.4 * GB + 2 * 512 * 2**20 + 3.73 * GB, rel=0.01)
    assert plan.fits, plan.reasons
    assert any("worst case" in w for w in plan.warnings)  # 350k tokens of KV cache against 786k
    resident = plan_memory(replace(inputs_from_config(config_8b(qwen3_8b_dir)), trainer_offloaded=False))
    assert not resident.fits and resident.reasons[0].startswith("the generation phase needs")
    full_logits = replace(inputs_from_config(config_8b(qwen3_8b_dir)), logprob_chunk_tokens=0)
    assert plan_memory(full_logits).phases["training"] > 65 * GB


def test_qwen3_8b_sync_host_memory_and_checkpoint_disk_by_hand(qwen3_8b_dir: Path):
    p = model_shapes(str(qwen3_8b_dir)).num_params
    plan = plan_memory(inputs_from_config(config_8b(qwen3_8b_dir)))
    f = plan.figures
    assert f["weight push per sync (engine dtype)"] == 2 * p  # bf16 to the bf16 engine: 16.4 GB, not fp32's 32.8
    assert f["host pinned memory (offload), per rank"] == 12 * p // 8  # fp32 parameters and AdamW's two states
    assert f["host pinned memory (offload), per node"] == 8 * (12 * p // 8) == pytest.approx(98.3 * GB, rel=0.01)
    assert f["checkpoint on disk, each"] == 12 * p  # fp32 parameters and AdamW whole
    assert f["checkpoints on disk, all kept"] == 2 * 12 * p  # the shipped config keeps the newest 2
    assert not any("ModelCheckpoint" in w for w in plan.warnings)

    every = config_8b(qwen3_8b_dir)
    every["trainer"]["callbacks"][1]["init_args"] = {"every_n_train_steps": 5, "save_top_k": -1}
    unbounded = plan_memory(inputs_from_config(every))
    assert unbounded.figures["checkpoints on disk, all kept"] == 40 * 12 * p  # 200 steps / 5: 3.9 TB
    (warning,) = [w for w in unbounded.warnings if "ModelCheckpoint" in w]
    assert "40 of them, 3,932 GB" in warning and "save_top_k: k, monitor: step, mode: max" in warning
    with_reference = plan_memory(replace(inputs_from_config(config_8b(qwen3_8b_dir)), kl_coef=0.1))
    assert with_reference.figures["checkpoint on disk, each"] == 16 * p  # the frozen reference is saved too


def test_qwen3_8b_on_1_gpu_does_not_fit(qwen3_8b_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--config", str(CONFIG_8B), "--devices", "1", "--override", f"model.model_path={qwen3_8b_dir}"])
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert "1 GPU(s)" in out and "peak: training" in out
    verdict = next(line for line in out.splitlines() if line.startswith("verdict:"))
    assert "DOES NOT FIT" in verdict and "phase needs" in verdict
    plan = plan_memory(inputs_from_config(config_8b(qwen3_8b_dir, devices=1)))
    assert plan.phases["training"] > 80 * GB and any("training phase" in r for r in plan.reasons)


def test_plan_takes_fits_overrides_and_prints_no_warning_about_them(
    qwen3_8b_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch, recwarn
):
    """``--model.model_path X`` as fit takes it, beside the plan's own options; Lightning's warning about ``args``
    given beside ``sys.argv`` (pytest's here, the shell's in use) is not printed."""
    monkeypatch.chdir(REPO_ROOT)
    args = ["--config", str(CONFIG_8B), "--model.model_path", str(qwen3_8b_dir), "--model.loss.kl_coef=0.1"]
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", *args, "--devices", "1"])
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{CONFIG_8B}: 8.19B parameters, 1 GPU(s), per GPU:")
    reference = next(line for line in out.splitlines() if line.startswith("reference (fp32, sharded)"))
    assert float(reference.split()[-2]) == pytest.approx(4 * 8.19, rel=0.01)  # kl_coef 0.1: an fp32 reference
    assert not [w for w in recwarn if "args parameter" in str(w.message)]


def test_a_missing_model_config_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch):
    monkeypatch.chdir(tmp_path)  # the shipped config's model path does not exist here
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--config", str(CONFIG_8B)])
    assert exit_info.value.code == 2
    assert "model.model_path='pretrained_models/Qwen3-8B': no config.json there" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- measured on CPU


def test_states_equal_real_tensors_after_an_adamw_step():
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**SMALL)).float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.randint(0, 4096, (1, 16)), use_cache=False).logits.float().mean().backward()
    optimizer.step()
    params = sum(p.nbytes for p in model.parameters())
    grads = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    states = sum(t.nbytes for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    f = plan_memory(small_inputs()).figures
    assert f["parameters (fp32, sharded)"] == pytest.approx(params, rel=0.01)
    assert f["gradients (fp32, sharded)"] == pytest.approx(grads, rel=0.01)
    assert f["AdamW states (2 x fp32, sharded)"] == pytest.approx(states, rel=0.01)


def test_logits_equal_real_logits_and_their_upcast():
    model = Qwen3ForCausalLM(Qwen3Config(**SMALL)).to(torch.bfloat16)
    tokens = 300
    with torch.no_grad():
        logits = model(input_ids=torch.randint(0, 4096, (1, tokens)), use_cache=False).logits
    measured = logits.nbytes + logits.float().nbytes
    planned = plan_memory(
        small_inputs(param_dtype="bfloat16", micro_batch_tokens=tokens, logprob_chunk_tokens=0)
    ).figures
    assert planned["logits (param dtype + fp32)"] == pytest.approx(measured, rel=0.15)


def saved_bytes(model: torch.nn.Module, **inputs) -> int:
    """Bytes of the distinct storages autograd saves for backward in one forward (parameters left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**inputs)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_activations_without_checkpointing_match_saved_tensors(dtype: str, packed: bool):
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**SMALL)).to(getattr(torch, dtype)).train()
    tokens = 512
    inputs = {"input_ids": torch.randint(0, 4096, (1, tokens)), "use_cache": False}
    if packed:  # two sequences in one row: transformers builds a mask and repeats the key-value heads
        inputs["position_ids"] = torch.cat([torch.arange(256), torch.arange(256)]).unsqueeze(0)
    measured = saved_bytes(model, **inputs)
    planned = plan_memory(small_inputs(param_dtype=dtype, micro_batch_tokens=tokens, sequence_packing=packed))
    assert planned.figures["activations, no checkpointing"] == pytest.approx(measured, rel=0.15)


def test_activations_with_checkpointing_match_saved_tensors():
    """What a checkpointed forward keeps (each layer's input); the one-layer recompute in backward is not measured."""
    model = Qwen3ForCausalLM(Qwen3Config(**SMALL)).to(torch.bfloat16).train()
    model.gradient_checkpointing_enable()
    tokens = 512
    measured = saved_bytes(model, input_ids=torch.randint(0, 4096, (1, tokens)), use_cache=False)
    x = small_inputs(param_dtype="bfloat16", micro_batch_tokens=tokens, sequence_packing=False)
    kept = tokens * (x.num_layers * 2 * x.hidden_size + outside_layers_activation_bytes_per_token(x))
    assert kept == pytest.approx(measured, rel=0.15)


# ---------------------------------------------------------------------------------------------------- fit refuses


class _FakeGPU:
    total_memory = 80 * GB


@pytest.mark.slow  # a LightningCLI run up to before_fit
def test_fit_refuses_a_run_that_cannot_fit_before_loading_weights(qwen3_8b_dir: Path, tmp_path: Path, monkeypatch):
    """The model folder holds only config.json: had fit loaded anything, it would fail on the missing weights."""
    config = config_8b(qwen3_8b_dir, devices=1)
    config["trainer"].update(accelerator="auto", logger=False, callbacks=config["trainer"]["callbacks"][:1])
    config["trainer"]["strategy"] = "auto"
    config["data"].update(train_files=str(REPO_ROOT / "data/samples/math_sample_train.jsonl"), val_files=None)
    config["data"]["prompts_per_step"] = 8
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the check runs for GPU runs only
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: _FakeGPU())
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(path)])
    assert "the run does not fit on this GPU (80 GB): the training phase needs" in str(exit_info.value.code)


QWEN3_0_6B = {**QWEN3_8B, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28}
QWEN3_0_6B.update(num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True)


def test_the_one_gpu_smoke_config_fits_one_80_gb_gpu(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_0_6B))
    config = yaml.safe_load((REPO_ROOT / "configs" / "qwen3_0_6b_gpu_smoke.yaml").read_text())
    config["model"]["model_path"] = str(tmp_path)
    inputs = inputs_from_config(config)
    assert 0.5e9 < inputs.num_params < 0.7e9 and inputs.data_parallel_size == 1
    plan = plan_memory(inputs)
    assert plan.fits, plan.reasons


CHUNK_PEAK = """
import sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM, Qwen3Config
from lit_agentrl.training.logprobs import model_token_logprobs

tokens, chunk = int(sys.argv[1]), int(sys.argv[2])
config = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
model = AutoModelForCausalLM.from_config(config).float()
ids = torch.randint(0, 151936, (1, tokens))
positions = torch.ones(1, tokens, dtype=torch.bool)
def kib(field):
    return next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field))
Path("/proc/self/clear_refs").write_text("5")
before = kib("VmRSS:")
out = model_token_logprobs(model, {"input_ids": ids, "use_cache": False}, ids, positions, chunk_tokens=chunk)
out.logprobs.sum().backward()
print((kib("VmHWM:") - before) * 1024)
"""


def test_the_log_prob_chunk_equals_the_measured_peak_of_a_chunked_pass():
    """Peak host memory of a real chunked forward and backward on CPU (fp32, Qwen3's vocabulary), in a fresh
    process, against the planner's chunk figure (the model's own activations here are a few MB)."""
    import subprocess
    import sys

    tokens, chunk = 2048, 512
    done = subprocess.run([sys.executable, "-c", CHUNK_PEAK, str(tokens), str(chunk)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = int(done.stdout.strip().splitlines()[-1])
    inputs = small_inputs(vocab_size=151936, micro_batch_tokens=tokens, logprob_chunk_tokens=chunk)
    planned = plan_memory(inputs).figures["log-prob chunk (logits, temporaries, grads)"]
    assert planned == pytest.approx(measured, rel=0.15)


def test_a_tensor_parallel_engine_splits_its_weights_and_kv_cache_over_its_gpus(qwen3_8b_dir: Path):
    """engine_kwargs.tp_size 2: each GPU holds half of SGLang's weights and of each token's KV, and each engine
    serves the prompts of its two ranks."""
    one = plan_memory(inputs_from_config(config_8b(qwen3_8b_dir)))
    two = plan_memory(replace(inputs_from_config(config_8b(qwen3_8b_dir)), engine_tp_size=2))
    assert two.figures["SGLang weights"] == one.figures["SGLang weights"] // 2
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2
    assert two.worst_case_tokens == 2 * one.worst_case_tokens
    assert two.kv_capacity_tokens > 2 * one.kv_capacity_tokens  # half the bytes per token, and more room for it


def test_qwen3_8b_with_lora_fits_one_gpu_by_hand(qwen3_8b_dir: Path):
    """configs/qwen3_8b_math_agent_lora.yaml: rank 64 on every linear layer of a frozen bf16 base, one 80 GB GPU."""
    config = yaml.safe_load((REPO_ROOT / "configs" / "qwen3_8b_math_agent_lora.yaml").read_text())
    config["model"]["model_path"] = str(qwen3_8b_dir)
    inputs = inputs_from_config(config)
    h, i, kv, q = 4096, 12288, 8 * 128, 32 * 128
    per_layer = 64 * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))  # q, k and v, o, gate and up, down
    assert inputs.lora_params == 36 * per_layer == 174_587_904
    plan = plan_memory(inputs)
    f = plan.figures
    assert f["parameters (frozen base, sharded)"] == 2 * inputs.num_params  # bf16, one GPU: no fp32 master copy
    assert f["gradients (fp32, sharded)"] == 4 * inputs.lora_params and f["AdamW states (2 x fp32, sharded)"] == 8 * (
        inputs.lora_params
    )
    assert f["reference (fp32, sharded)"] == 0 and f["root grads unsharded"] == 0
    assert f["checkpoint on disk, each"] == 12 * inputs.lora_params  # the adapters and their AdamW states
    assert plan.fits and plan.phases["training"] < 40 * GB, plan.table()
    full = plan_memory(replace(inputs, lora_params=0, lora_rank=0))  # the same run without LoRA: 8 GPUs' worth
    assert not full.fits
    adapter_sync = plan_memory(replace(inputs, lora_sync="adapter"))
    assert adapter_sync.figures["weight push per sync (engine dtype)"] == 2 * inputs.lora_params  # 0.35 GB, not 16.4


# ------------------------------------------------------------------------------------- generation on its own GPUs


def test_the_disaggregated_8b_config_plans_4_trainer_gpus_and_4_servers_by_hand(
    qwen3_8b_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch
):
    """configs/qwen3_8b_math_agent_disagg.yaml: 4 trainer ranks with no engine beside them, 4 bf16 servers at SGLang's
    own memory fraction (the launch line leaves it to SGLang)."""
    from lit_agentrl.plan_servers import plan_servers

    config = yaml.safe_load(CONFIG_DISAGG.read_text())
    config["model"]["model_path"] = str(qwen3_8b_dir)
    inputs = inputs_from_config(config)
    assert (inputs.engine, inputs.rollout_servers, inputs.rollouts_ahead) == ("sglang_router", 4, 1)
    trainer = plan_memory(inputs)
    assert trainer.fits and trainer.figures["SGLang weights"] == 0  # nothing of SGLang on the trainer's GPUs
    assert trainer.phases["training"] < 80 * GB
    p = inputs.num_params
    servers = plan_servers(inputs)
    assert servers.figures["SGLang weights (per GPU)"] == 2 * p  # bf16
    kv_cache = int(SGLANG_DEFAULT_MEM_FRACTION * 80 * GB) - 2 * p
    assert servers.figures["SGLang KV cache (per GPU)"] == kv_cache
    assert servers.kv_capacity_tokens == kv_cache // (2 * 36 * 8 * 128 * 2)  # K and V, 36 layers, 8 heads, bf16
    # 64 prompts x 32 samples, this step's and the one ahead, over 4 servers, of up to 1024 + 2048 tokens each
    assert servers.tokens_per_server == 64 * 32 * 2 * (1024 + 2048) // 4
    assert servers.push_bytes == 2 * p  # bf16 to each server: 16.4 GB
    assert servers.push_seconds["collective"] == pytest.approx(2 * p / (25 * GB))
    assert servers.fits

    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--config", str(CONFIG_DISAGG), "--override", f"model.model_path={qwen3_8b_dir}"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "4 GPU(s)" in out and "4 rollout server(s), tensor-parallel size 1, per GPU:" in out
    assert "weight push over collective" in out and "weight push over disk" in out
    trainer_part = out.split("rollout server(s)")[0]
    assert "KV capacity" not in trainer_part  # no SGLang on the trainer's GPUs: no KV lines of zeros there
