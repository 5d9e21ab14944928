"""LoRA's weight sync: after an update, the transformers engine reproduces the policy's greedy tokens (and its
log-probs), whether it gets the merged weights or the adapter alone; an engine that cannot serve adapters is
refused at setup; and ``lit-agentrl fit --model.lora.rank 8`` trains the quickstart both ways."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml
from support import FSDP_TWO_RANKS, REPO_ROOT, short_fit
from test_lora import LORA, lora_module

from lit_agentrl.bridge.weights import sync_weights
from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.errors import UserInputError
from lit_agentrl.rollout.fleet import EngineFleet
from lit_agentrl.training.lora import adapters_disabled

PROMPT = [5, 9, 11, 3, 7, 21]


def policy_greedy(model: torch.nn.Module, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    tokens, logprobs = list(ids), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([tokens])).logits[0, -1].float()
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            tokens.append(token)
    return tokens[len(ids) :], logprobs


def scored(model: torch.nn.Module, ids: list[int], tokens: list[int]) -> list[float]:
    """The log-probs ``model`` gives ``tokens`` after ``ids``, teacher-forced."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + tokens])).logits[0, len(ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1).tolist()


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_the_synced_engine_reproduces_the_policys_greedy_tokens(tiny_model_dir, sync):
    lora = dataclasses.replace(LORA, sync=sync)
    module = lora_module(str(tiny_model_dir), lora=lora)  # B is not zero: as after updates
    engine = TransformersEngine(str(tiny_model_dir), prefix_cache_mb=0)
    try:
        params = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
        pushed = sync_weights(module.policy, [engine], lora=lora)
        result = engine.generate(input_ids=PROMPT, sampling_params=params, return_logprob=True)
    finally:
        engine.shutdown()
    tokens, logprobs = policy_greedy(module.policy, PROMPT, 12)
    assert result["output_ids"] == tokens
    engine_logprobs = [entry[0] for entry in result["meta_info"]["output_token_logprobs"]]
    assert engine_logprobs == pytest.approx(logprobs, abs=1e-4)
    with adapters_disabled(module.policy):  # the base scores those tokens otherwise: the push carried the adapters
        base_logprobs = scored(module.policy, PROMPT, tokens)
    assert max(abs(a - b) for a, b in zip(base_logprobs, logprobs)) > 1e-2
    layers = module.policy.config.num_hidden_layers
    adapter_tensors = 2 * layers * len(lora.target_modules)
    assert pushed.tensors == (adapter_tensors if sync == "adapter" else len(dict(engine.model.named_parameters())))


class PlainEngine(RolloutEngine):
    async def async_generate(self, *args, **kwargs):
        raise AssertionError("not called")

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        return True, ""


def test_an_engine_that_cannot_serve_adapters_is_refused_for_adapter_sync():
    with pytest.raises(UserInputError, match=r"model.lora.sync: adapter needs engines .*\['PlainEngine'\]"):
        EngineFleet([PlainEngine()], lora=dataclasses.replace(LORA, sync="adapter"))
    EngineFleet([PlainEngine()], lora=LORA)  # merged weights: any engine


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_the_quickstart_trains_with_lora(tmp_path, quickstart_model_dir, monkeypatch, sync):
    monkeypatch.chdir(REPO_ROOT)
    settings = yaml.safe_load((REPO_ROOT / "configs/quickstart.yaml").read_text())
    settings["model"]["lora"] = {"rank": 8, "sync": sync}
    if sync == "adapter":  # the engine keeps its own base: in the CPU engine's dtype (refused otherwise)
        settings["model"]["lora"]["base_dtype"] = "float32"
    config = tmp_path / "quickstart_lora.yaml"
    config.write_text(yaml.safe_dump(settings))
    rows = [r for r in short_fit(config, quickstart_model_dir, tmp_path / "log") if r.get("train/loss")]
    assert len(rows) == 3
    assert all(float(r["rollout/failed"]) == 0.0 and float(r["train/grad_norm"]) > 0 for r in rows)


def test_export_writes_a_peft_adapter_and_the_merged_model(tiny_model_dir, tmp_path):
    from types import SimpleNamespace

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lit_agentrl.callbacks.export import HFExportCallback

    module = lora_module(str(tiny_model_dir), lora=LORA)
    trainer = SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(barrier=lambda name: None))
    HFExportCallback(str(tmp_path), merge_lora=True).export(trainer, module, tmp_path / "final", merge=True)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        policy = module.policy(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base, tmp_path / "final")  # peft's own loader, as users load it
        torch.testing.assert_close(adapted(input_ids=ids).logits, policy)
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final" / "merged", dtype=torch.float32)
        torch.testing.assert_close(merged(input_ids=ids).logits, policy, atol=1e-5, rtol=1e-4)
    assert (tmp_path / "final" / "tokenizer_config.json").exists()


def resume_run_config(folder: Path, model_dir: Path, **trainer) -> Path:
    """4 steps of the quickstart's shape with LoRA's adapters trained (16 samples a prompt, so some groups are not
    flat), a checkpoint every step and an export at the end, admission deterministic (bit-exact resumes)."""
    from support import quick_config

    folder.mkdir(exist_ok=True)
    callbacks = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(folder / "ckpt"), "every_n_train_steps": 1, "save_top_k": -1},
        },
        {"class_path": "HFExportCallback", "init_args": {"dirpath": str(folder / "hf")}},
    ]
    engine = {"deterministic": True}
    return quick_config(
        folder, model_dir, 4, callbacks, n_samples=16, engine_kwargs=engine, enable_checkpointing=True, **trainer
    )


def assert_same_trained_adapters(straight_dir: Path, resumed_dir: Path) -> None:
    from safetensors.torch import load_file

    straight, resumed = (
        load_file(d / "hf" / "final" / "adapter_model.safetensors") for d in (straight_dir, resumed_dir)
    )
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert any(t.abs().max() > 0 for k, t in straight.items() if "lora_B" in k)  # trained: B left its zero start


@pytest.mark.slow
def test_a_lora_checkpoint_holds_the_adapter_and_resumes_exactly(tmp_path, quickstart_model_dir):
    from lit_agentrl.cli import main

    def run(folder: str, *extra: str) -> None:
        config = resume_run_config(tmp_path / folder, quickstart_model_dir)
        main(
            ["fit", "--config", str(config), "--model.lora.rank", "4", "--trainer.enable_progress_bar", "false", *extra]
        )

    run("straight")
    step2 = next((tmp_path / "straight" / "ckpt").glob("*step=2.ckpt"))
    checkpoint = torch.load(step2, weights_only=False)
    assert checkpoint["state_dict"] and all("lora_" in key for key in checkpoint["state_dict"])
    (optimizer,) = checkpoint["optimizer_states"]
    assert len(optimizer["state"]) == len(checkpoint["state_dict"])  # Adam's moments of the adapters alone
    run("resumed", "--ckpt_path", str(step2))
    assert_same_trained_adapters(tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_process_fsdp2_lora_checkpoints_the_adapter_shards_and_resumes_exactly(tmp_path, quickstart_model_dir):
    import os
    import subprocess
    import sys

    from torch.distributed.checkpoint import FileSystemReader

    def run(folder: str, *extra: str) -> None:
        config = resume_run_config(tmp_path / folder, quickstart_model_dir, devices=2, strategy=FSDP_TWO_RANKS)
        command = [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(config), "--model.lora.rank", "4"]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        result = subprocess.run([*command, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert result.returncode == 0, result.stderr[-4000:]

    run("straight")
    step2 = next((tmp_path / "straight" / "ckpt").glob("*step=2.ckpt"))
    saved = list(FileSystemReader(str(step2)).read_metadata().state_dict_metadata)
    weights = [k for k in saved if k.startswith("state_dict.")]
    assert weights and all("lora_" in k for k in weights)  # the adapters' shards (and their Adam moments) alone
    assert all("lora_" in k for k in saved if k.startswith("optimizer_0.state."))
    run("resumed", "--ckpt_path", str(step2))
    assert_same_trained_adapters(tmp_path / "straight", tmp_path / "resumed")
