"""The GPU proof (issue 11, item 9): one table of what the training and rollout paths do on this machine.

Rows (each ok / skipped: reason / failed: error, so one failing part hides none of the others):

1. FSDP2 training step: ``GRPOModule.accumulate_gradients`` plus AdamW on synthetic samples, one process, a
   DeviceMesh of size 1 (NCCL on GPU, gloo on CPU), the policy sharded by the module's own ``configure_model``.
   Tokens/s, MFU, peak memory.
2. The transformers engine (``lit_agentrl/engines/hf.py``): generation tokens/s over a batch of prompts.
3. A short real ``lit-agentrl fit`` (colocated SGLang on GPU) and the ``memory/*`` metrics it logged.
4. The memory planner (``lit_agentrl.plan``) for the same settings, beside what rows 1 and 3 measured.

The model is random-init with Qwen3-0.6B's shapes, built from a config into a temp folder (no download).

    python scripts/gpu_checks.py [--out table.json]   # on a CUDA GPU
    python scripts/gpu_checks.py --smoke              # the same code paths on CPU with a tiny model
    python scripts/gpu_checks.py --info               # what the machine has, then exit

Exits 1 when a row failed (skips are fine). Everything it writes goes to temp folders, or to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# `python scripts/gpu_checks.py` puts scripts/ first on sys.path: this checkout's lit_agentrl, installed or not
sys.path.insert(0, str(REPO_ROOT))

GB = 10**9
SMOKE_CONFIG = REPO_ROOT / "configs" / "qwen3_0_6b_gpu_smoke.yaml"
# Dense bf16 peaks (FLOP/s) by a fragment of the device name; other GPUs: --peak-tflops.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100 80GB HBM3": 989e12, "A100": 312e12}
MFU_FORMULA = "MFU = 6 x params x tokens / step time / peak bf16 FLOP/s (attention FLOPs not counted)"
MEMORY_KEYS = [
    "memory/gpu_used_gb_rollout",
    "memory/gpu_used_gb_train",
    "memory/gpu_used_gb_sync",
    "memory/trainer_peak_gb_rollout",
    "memory/trainer_peak_gb_train",
    "memory/trainer_peak_gb_sync",
    "memory/offloaded_gb",
]
QWEN3_0_6B = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151936,
}
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "intermediate_size": 128,
    "vocab_size": 512,
}


@dataclass(frozen=True)
class Profile:
    """What one run measures: the model's shapes, the training batch, the generation batch, the fit's size."""

    name: str
    device: str  # cuda or cpu
    model: dict[str, int]
    param_dtype: str  # the training step's FSDP2 param_dtype
    engine_dtype: str  # the transformers engine's dtype
    train_sequences: int
    train_seq_len: int
    micro_batch_tokens: int
    train_steps: int  # timed, after one warm-up step
    gen_prompts: int
    gen_prompt_len: int
    gen_new_tokens: int
    fit_timeout_s: int
    fit_overrides: dict[str, Any] = field(default_factory=dict)  # dotted config keys
    cpu_threads: int | None = None  # torch's intra-op threads here and in the fit (None: torch's default)

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


GPU = Profile(
    name="gpu",
    device="cuda",
    model=QWEN3_0_6B,
    param_dtype="bfloat16",
    engine_dtype="bfloat16",
    train_sequences=32,
    train_seq_len=2048,
    micro_batch_tokens=8192,
    train_steps=3,
    gen_prompts=64,
    gen_prompt_len=128,
    gen_new_tokens=256,
    fit_timeout_s=420,
    fit_overrides={"trainer.max_steps": 2},
)
SMOKE = Profile(
    name="smoke (CPU, tiny model)",
    device="cpu",
    model=TINY,
    param_dtype="bfloat16",  # row 1 as on the GPU: FSDP2 mixed precision and its bf16 load-time checks
    engine_dtype="float32",
    train_sequences=8,
    train_seq_len=64,
    micro_batch_tokens=256,
    train_steps=2,
    gen_prompts=4,
    gen_prompt_len=16,
    gen_new_tokens=8,
    fit_timeout_s=180,
    fit_overrides={
        "trainer.max_steps": 2,
        "trainer.accelerator": "cpu",
        "model.compute.param_dtype": "float32",
        "model.compute.gradient_checkpointing": False,
        "data.prompts_per_step": 2,
        "rollout.engine.name": "transformers",
        "rollout.engine.kwargs": {"dtype": "float32"},
        "rollout.engine.colocate": False,
        "rollout.n_samples": 2,
        "rollout.sampling_params": {"max_new_tokens": 8, "temperature": 1.0},
    },
    cpu_threads=1,  # a tiny model's ops are too small for threads; on a busy machine they cost 10x
)


class Skip(Exception):
    """A row that cannot run here; the message says why."""


@dataclass
class Row:
    id: int
    check: str
    status: str = "ok"  # ok | skipped | failed
    detail: str = ""  # why it was skipped, or the error
    summary: str = ""  # the measured values, for the table
    metrics: dict[str, Any] = field(default_factory=dict)

    def cell(self) -> str:
        return self.status if self.status == "ok" else f"{self.status}: {self.detail}"


def run_row(row_id: int, check: str, measure: Callable[[], tuple[dict[str, Any], str]]) -> Row:
    """Run one row's measurement; a Skip or an exception becomes the row's status instead of ending the run."""
    print(f"[gpu_checks] row {row_id}: {check} ...", flush=True)
    start = time.perf_counter()
    row = Row(row_id, check)
    try:
        row.metrics, row.summary = measure()
    except Skip as exc:
        row.status, row.detail = "skipped", str(exc)
    except Exception as exc:
        traceback.print_exc()
        row.status, row.detail = "failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    row.metrics["row_wall_s"] = round(time.perf_counter() - start, 1)
    print(f"[gpu_checks] row {row_id}: {row.cell()} ({row.metrics['row_wall_s']} s)", flush=True)
    return row


# ---------------------------------------------------------------------------------------------------- machine


def sglang_status() -> dict[str, Any]:
    """Whether SGLang imports, checked in a child process (so this one neither pays for it nor touches CUDA)."""
    if importlib.util.find_spec("sglang") is None:
        return {"importable": False, "version": None, "error": "sglang not installed"}
    code = "import sglang; print(sglang.__version__)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"importable": False, "version": None, "error": "import sglang took over 300 s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"importable": False, "version": None, "error": f"import sglang failed: {last}"}
    return {"importable": True, "version": done.stdout.strip(), "error": None}


def machine_info(sglang: dict[str, Any]) -> dict[str, Any]:
    """Versions and the GPU (creates a CUDA context: call it after the fit, whose device-wide memory it would join)."""
    import lightning
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch.version.cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "lightning": lightning.__version__,
        "sglang": sglang["version"] if sglang["importable"] else sglang["error"],
        "gpu": None,
        "gpu_memory_gb": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name, gpu_memory_gb=round(props.total_memory / GB, 1), gpu_count=torch.cuda.device_count()
        )
    return info


def installed_distributions() -> list[str]:
    """``name==version`` of every distribution this Python has installed (what ``pip list --format=freeze`` prints)."""
    found = {
        dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions() if dist.metadata["Name"]
    }
    return [f"{name}=={version}" for name, version in sorted(found.items(), key=lambda item: item[0].lower())]


def gpu_memory_bytes() -> int | None:
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


# ---------------------------------------------------------------------------------------------------- model


def build_model_dir(profile: Profile, out: Path) -> Path:
    """A random-init Qwen3 of the profile's shapes and the project's tiny BPE tokenizer, saved under ``out``.

    Built on CPU (a CUDA context here would count in row 3's device-wide memory). The vocabulary is the model's,
    larger than the tokenizer's: ids past the tokenizer decode to nothing, which rollouts and training accept.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from lit_agentrl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out)
    config = Qwen3Config(
        **{**profile.model, "vocab_size": max(profile.model["vocab_size"], len(tokenizer))},
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    return out


def num_params(model_dir: Path) -> int:
    from lit_agentrl.plan import model_shapes

    return model_shapes(str(model_dir)).num_params  # tied embeddings counted once


# ---------------------------------------------------------------------------------------------------- row 1


def synthetic_samples(count: int, length: int, vocab: int) -> list[Any]:
    """``count`` sequences of ``length`` trained tokens each (loss on every token, so 6 x params x tokens holds)."""
    import torch

    from lit_agentrl.training.batching import TrainingSample

    g = torch.Generator().manual_seed(0)
    old = -math.log(vocab)  # what a random-init policy gives a token
    samples = []
    for i in range(count):
        ids = torch.randint(3, vocab, (length + 1,), generator=g).tolist()
        samples.append(TrainingSample(ids[:-1], ids[1:], [1] * length, [old] * length, 1.0 if i % 2 else -1.0))
    return samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def device_of(profile: Profile) -> Any:
    import torch

    if profile.device == "cuda" and not torch.cuda.is_available():
        raise Skip("no CUDA GPU visible")
    return torch.device("cuda", 0) if profile.device == "cuda" else torch.device("cpu")


def measure_training(profile: Profile, model_dir: Path, peak_flops: float | None) -> tuple[dict[str, Any], str]:
    """One process under FSDP2, as ModelParallelStrategy(data_parallel_size=1) sets it up, without a Trainer."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = device_of(profile)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(profile.backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh(device.type, (1, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        module = sharded_module(profile, model_dir, device, mesh)
        return _timed_steps(profile, model_dir, device, module, peak_flops)
    finally:
        dist.destroy_process_group()
        _free_accelerator_memory()


def sharded_module(profile: Profile, model_dir: Path, device: Any, mesh: Any) -> Any:
    """The policy as a run configures it: packed sequences (its load-time packing check runs, at the bf16
    tolerance under bf16) and the chunked log-prob head at its default chunk."""
    from lit_agentrl.config.training import Compute
    from lit_agentrl.training.module import GRPOModule

    compute = Compute(micro_batch_tokens=profile.micro_batch_tokens, param_dtype=profile.param_dtype)  # type: ignore[arg-type]
    module = GRPOModule(str(model_dir), compute=compute)
    module._device_mesh = mesh  # what ModelParallelStrategy sets before configure_model
    module.to(device)
    module.configure_model()  # sharded on the meta device, then filled from the checkpoint (lit_agentrl.training.loading)
    return module


def _timed_steps(
    profile: Profile, model_dir: Path, device: Any, module: Any, peak_flops: float | None
) -> tuple[dict[str, Any], str]:
    import torch

    optimizer = torch.optim.AdamW(module.policy.parameters(), lr=1e-6)
    samples = synthetic_samples(profile.train_sequences, profile.train_seq_len, module.policy.config.vocab_size)

    def step() -> dict[str, float]:
        optimizer.zero_grad(set_to_none=True)
        stats = module.accumulate_gradients(samples)
        start = clock(device)
        torch.nn.utils.clip_grad_norm_(module.policy.parameters(), 1.0)
        optimizer.step()
        stats["time/optimizer_s"] = clock(device) - start
        return stats

    step()  # warm-up: kernels chosen, AdamW's states allocated
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = clock(device)
    stats = [step() for _ in range(profile.train_steps)]
    seconds = (clock(device) - start) / profile.train_steps
    metrics, summary = _training_result(profile, model_dir, device, seconds, stats, sum(map(len, samples)), peak_flops)
    metrics["sequence_packing"] = module.compute.sequence_packing
    return metrics, summary


def clock(device: Any) -> float:
    """Wall time once the device's queued work is done."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _training_result(
    profile: Profile,
    model_dir: Path,
    device: Any,
    seconds: float,
    stats: list[dict[str, float]],
    tokens: int,
    peak_flops: float | None,
) -> tuple[dict[str, Any], str]:
    import torch

    params = num_params(model_dir)
    mean = {key: sum(s[key] for s in stats) / len(stats) for key in ("time/forward_s", "time/backward_s")}
    metrics: dict[str, Any] = {
        "params": params,
        "tokens_per_step": tokens,
        "micro_batch_tokens": profile.micro_batch_tokens,
        "param_dtype": profile.param_dtype,
        "step_s": round(seconds, 4),
        "forward_s": round(mean["time/forward_s"], 4),
        "backward_s": round(mean["time/backward_s"], 4),
        "optimizer_s": round(sum(s["time/optimizer_s"] for s in stats) / len(stats), 4),
        "tokens_per_s": round(tokens / seconds, 1),
        "mfu": round(6 * params * tokens / seconds / peak_flops, 4) if peak_flops else None,
        "peak_allocated_gb": None,
        "peak_reserved_gb": None,
    }
    if device.type == "cuda":
        metrics["peak_allocated_gb"] = round(torch.cuda.max_memory_allocated(device) / GB, 2)
        metrics["peak_reserved_gb"] = round(torch.cuda.max_memory_reserved(device) / GB, 2)
    mfu = f"{metrics['mfu']:.1%}" if metrics["mfu"] is not None else "n/a (no peak FLOP/s for this device)"
    peak = f"{metrics['peak_allocated_gb']} GB" if metrics["peak_allocated_gb"] is not None else "n/a (CPU)"
    summary = (
        f"{_count(params)} params, {profile.param_dtype}, {tokens:,} tokens/step in {seconds:.3f} s: "
        f"{metrics['tokens_per_s']:,.0f} tokens/s; MFU {mfu}; peak allocated {peak}"
    )
    return metrics, summary


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _free_accelerator_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- row 2


def measure_generation(profile: Profile, model_dir: Path) -> tuple[dict[str, Any], str]:
    """The transformers engine's tokens/s over a batch of random prompts, every one generating to the limit."""
    import torch

    from lit_agentrl.engines.hf import TransformersEngine

    device = device_of(profile)
    engine = TransformersEngine(str(model_dir), device=str(device), dtype=profile.engine_dtype, prefix_cache_mb=0)
    try:
        g = torch.Generator().manual_seed(1)
        prompts = torch.randint(3, 300, (profile.gen_prompts, profile.gen_prompt_len), generator=g).tolist()
        params = {"max_new_tokens": profile.gen_new_tokens, "temperature": 1.0, "ignore_eos": True}
        engine.generate(input_ids=prompts[:2], sampling_params={**params, "max_new_tokens": 4})  # warm-up
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        results = engine.generate(input_ids=prompts, sampling_params=params)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
        del engine
        _free_accelerator_memory()
    assert isinstance(results, list)
    tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    metrics = {
        "prompts": profile.gen_prompts,
        "prompt_tokens": profile.gen_prompt_len,
        "new_tokens": profile.gen_new_tokens,
        "dtype": profile.engine_dtype,
        "generated_tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "peak_allocated_gb": round(torch.cuda.max_memory_allocated() / GB, 2) if device.type == "cuda" else None,
    }
    summary = (
        f"{profile.gen_prompts} prompts x {profile.gen_prompt_len} tokens -> {profile.gen_new_tokens} new, "
        f"{profile.engine_dtype}: {tokens:,} tokens in {seconds:.2f} s = {metrics['tokens_per_s']:,.0f} tokens/s"
    )
    return metrics, summary


# ---------------------------------------------------------------------------------------------------- row 3


def fit_config(profile: Profile, model_dir: Path, workdir: Path) -> dict[str, Any]:
    """configs/qwen3_0_6b_gpu_smoke.yaml (FSDP2 over one process: its ModelParallelStrategy) with the local model,
    logs in ``workdir`` and validation off."""
    import yaml

    from lit_agentrl.config.run_file import set_keys

    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    trainer = config["trainer"]
    for key in ("val_check_interval", "check_val_every_n_epoch"):
        trainer.pop(key, None)
    trainer.update(
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(workdir),
    )
    trainer["logger"]["init_args"] = {"save_dir": str(workdir / "logs"), "name": "csv"}
    config["model"]["model_path"] = str(model_dir)
    for key in ("train_files", "val_files"):  # the fit runs in ``workdir``
        config["data"][key] = str(REPO_ROOT / config["data"][key])
    return set_keys(config, profile.fit_overrides)


def measure_fit(profile: Profile, model_dir: Path, workdir: Path, sglang: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A real ``lit-agentrl fit`` in a child process; its CSV's ``memory/*`` metrics, "missing" where not logged."""
    from lit_agentrl.config.run_file import rollout_args, write_config

    config = fit_config(profile, model_dir, workdir)
    if rollout_args(config)["engine"]["name"] == "sglang" and not sglang["importable"]:
        raise Skip(sglang["error"])
    if config["trainer"]["accelerator"] in ("gpu", "cuda"):
        device_of(profile)  # Skip without a GPU
    workdir.mkdir(parents=True, exist_ok=True)
    path = write_config(config, workdir / "config.yaml")
    seconds = run_fit(path, workdir, profile.fit_timeout_s, profile.cpu_threads)
    return fit_result(config, workdir, seconds)


def run_fit(config: Path, workdir: Path, timeout_s: int, threads: int | None) -> float:
    """``python -m lit_agentrl.cli fit`` in its own session (SGLang's children die with it on a timeout)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(workdir / "wandb"),
        "TOKENIZERS_PARALLELISM": "false",
        **({"OMP_NUM_THREADS": str(threads)} if threads else {}),
    }
    log = workdir / "fit.log"
    start = time.perf_counter()
    with open(log, "w") as out:
        command = [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(config)]
        proc = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_group(proc)  # whatever the fit left running (SGLang's processes) goes, so rows 1-2 get the GPU
    if code is None:
        raise RuntimeError(f"the fit ran over {timeout_s} s (log: {log})")
    if code != 0:
        tail = log.read_text()[-3000:]
        print(tail, file=sys.stderr)
        last = next((line for line in reversed(tail.splitlines()) if line.strip()), "?")
        raise RuntimeError(f"the fit exited {code}: {last.strip()} (log: {log})")
    return time.perf_counter() - start


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # nothing left
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def fit_result(config: dict[str, Any], workdir: Path, seconds: float) -> tuple[dict[str, Any], str]:
    from lit_agentrl.config.run_file import rollout_args

    found = sorted((workdir / "logs").rglob("metrics.csv"))
    if not found:
        raise RuntimeError(f"the fit wrote no metrics.csv under {workdir / 'logs'}")
    with open(found[-1]) as f:
        rows = list(csv.DictReader(f))
    steps = sum(1 for r in rows if r.get("rollout/reward_mean"))
    memory = {key: _max_logged(rows, key) for key in MEMORY_KEYS}
    engine = rollout_args(config)["engine"]
    metrics = {
        "engine": engine["name"],
        "colocate": engine.get("colocate", False),
        "steps": steps,
        "seconds": round(seconds, 1),
        "memory_gb": memory,  # each key's largest value over the logged steps; None: not logged
        "metrics_csv": str(found[-1]),
    }
    shown = "; ".join(f"{k.removeprefix('memory/')} {v if v is not None else 'missing'}" for k, v in memory.items())
    summary = (
        f"{engine['name']}, colocate {str(metrics['colocate']).lower()}: {steps} steps in {seconds:.0f} s; {shown}"
    )
    return metrics, summary


def _max_logged(rows: list[dict[str, str]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return round(max(values), 2) if values else None


# ---------------------------------------------------------------------------------------------------- row 4


def training_plan_inputs(profile: Profile, model_dir: Path, gpu_memory: int) -> Any:
    """Row 1's settings as the planner's inputs; the transformers engine adds no modelled GPU memory."""
    from lit_agentrl.callbacks import RolloutCallback
    from lit_agentrl.config.training import Compute
    from lit_agentrl.plan import TrainerLayout, inputs_from_run
    from lit_agentrl.training.module import GRPOModule

    compute = Compute(
        micro_batch_tokens=profile.micro_batch_tokens,
        param_dtype=profile.param_dtype,  # type: ignore[arg-type]
        gradient_checkpointing=False,
        sequence_packing=True,
    )
    module = GRPOModule(str(model_dir), compute=compute)
    return inputs_from_run(module, RolloutCallback(engine="transformers"), None, TrainerLayout(), gpu_memory)


def measure_plan(
    profile: Profile, model_dir: Path, workdir: Path, train: Row, fit: Row, gpu_memory: int | None
) -> tuple[dict[str, Any], str]:
    """The planner's training and generating peaks beside rows 1 and 3's measurements, with relative errors."""
    from lit_agentrl.cli import inputs_from_config
    from lit_agentrl.plan import plan_memory

    memory = gpu_memory or 80 * GB  # on CPU the planner's default GPU; the peaks do not depend on it
    trained = plan_memory(training_plan_inputs(profile, model_dir, memory)).phases
    fitted = plan_memory(inputs_from_config(fit_config(profile, model_dir, workdir), memory)).phases
    fit_memory = fit.metrics.get("memory_gb") or {}
    rows = [
        _compare("training peak vs row 1 max_memory_allocated", trained["training"], train.metrics.get("peak_allocated_gb")),
        _compare("fit training peak vs trainer_peak_gb_train", fitted["training"], fit_memory.get("memory/trainer_peak_gb_train")),
        _compare("fit training peak vs gpu_used_gb_train", fitted["training"], fit_memory.get("memory/gpu_used_gb_train")),
        _compare("fit generating peak vs gpu_used_gb_rollout", fitted["generation"], fit_memory.get("memory/gpu_used_gb_rollout")),
    ]  # fmt: skip
    metrics = {"gpu_memory_gb": round(memory / GB, 1), "comparisons": rows}
    return metrics, "; ".join(_describe(c) for c in rows)


def _compare(what: str, predicted: int, measured: float | None) -> dict[str, Any]:
    predicted_gb = round(predicted / GB, 2)
    error = round((predicted_gb - measured) / measured, 3) if measured else None
    return {"what": what, "predicted_gb": predicted_gb, "measured_gb": measured, "rel_error": error}


def _describe(c: dict[str, Any]) -> str:
    if c["measured_gb"] is None:
        return f"{c['what']}: plan {c['predicted_gb']} GB vs n/a"
    error = f" ({c['rel_error']:+.0%})" if c["rel_error"] is not None else ""
    return f"{c['what']}: plan {c['predicted_gb']} GB vs {c['measured_gb']} GB{error}"


# ---------------------------------------------------------------------------------------------------- table


def markdown(rows: list[Row], notes: list[str]) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| # | check | status | measured |", "|---|---|---|---|"]
    lines += [f"| {r.id} | {esc(r.check)} | {esc(r.cell())} | {esc(r.summary)} |" for r in rows]
    return "\n".join([*lines, "", *notes])


def notes_for(profile: Profile, peak_flops: float | None) -> list[str]:
    peak = f"{peak_flops / 1e12:.0f} TFLOP/s" if peak_flops else "unknown here (pass --peak-tflops)"
    return [
        f"profile: {profile.name}; row 1 model and fit model: random-init Qwen3 {profile.model}",
        f"{MFU_FORMULA}; peak used: {peak} (H200 dense bf16: 989 TFLOP/s)",
        "row 1 times accumulate_gradients + clip + AdamW over the timed steps, after one warm-up step",
        f"row 3: {SMOKE_CONFIG.name} (ModelParallelStrategy, data_parallel_size=1), no validation, {profile.fit_overrides}",
        "GB = 10^9 bytes; row 3 shows each memory/* metric's largest value over the steps ('missing': not logged)",
    ]


def peak_flops_for(profile: Profile, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    import torch

    if profile.device != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((flops for fragment, flops in PEAK_BF16_FLOPS.items() if fragment in name), None)


def run_checks(profile: Profile, workdir: Path, peak_tflops: float | None) -> dict[str, Any]:
    """Every row. The fit runs first, before this process creates a CUDA context that its device-wide memory
    figures would include; the table lists the rows in order."""
    start = time.perf_counter()
    sglang = sglang_status()
    model_dir = build_model_dir(profile, workdir / "model")
    fit_dir = workdir / "fit"
    fit = run_row(3, "lit-agentrl fit: memory over the rollout/train/sync cycle", lambda: measure_fit(profile, model_dir, fit_dir, sglang))  # fmt: skip
    info = machine_info(sglang)
    peak_flops = peak_flops_for(profile, peak_tflops)
    train = run_row(1, "FSDP2 training step (GRPOModule.accumulate_gradients)", lambda: measure_training(profile, model_dir, peak_flops))  # fmt: skip
    generate = run_row(2, "transformers engine generation", lambda: measure_generation(profile, model_dir))
    plan = run_row(4, "planner (lit_agentrl.plan) vs measured", lambda: measure_plan(profile, model_dir, fit_dir, train, fit, gpu_memory_bytes()))  # fmt: skip
    rows = [train, generate, fit, plan]
    notes = notes_for(profile, peak_flops)
    return {
        "profile": profile.name,
        "machine": info,
        "rows": [dataclasses.asdict(r) for r in rows],
        "notes": notes,
        "markdown": markdown(rows, notes),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model: the same code paths, in about a minute")
    parser.add_argument("--out", type=Path, help="the table as JSON (default: a new temp folder)")
    parser.add_argument("--workdir", type=Path, help="model, fit config and logs (default: temp, kept on failure)")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for MFU")
    parser.add_argument("--info", action="store_true", help="print what the machine has and exit")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.info:
        for key, value in machine_info(sglang_status()).items():
            print(f"{key}: {value}")
        print("\n# installed distributions, for scripts/gpu_machine.txt (what scripts/gpu_wheelhouse.py leaves out):")
        print("\n".join(installed_distributions()))
        return 0
    profile = SMOKE if args.smoke else GPU
    if profile.cpu_threads:
        import torch

        torch.set_num_threads(profile.cpu_threads)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu_checks_"))
    result = run_checks(profile, workdir, args.peak_tflops)
    failed = any(r["status"] == "failed" for r in result["rows"])
    if args.workdir is None and not failed:
        shutil.rmtree(workdir, ignore_errors=True)
    elif failed:
        print(f"kept for the logs (fit.log, config.yaml): {workdir}")
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_checks_")) / "gpu_checks.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print("\n" + "\n".join(f"{k}: {v}" for k, v in result["machine"].items()))
    print("\n" + result["markdown"])
    print(f"\ntable JSON: {out} ({result['wall_s']} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
