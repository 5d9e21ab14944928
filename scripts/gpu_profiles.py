"""What one run of scripts/gpu_checks.py measures and how each measurement becomes a table row.

The two profiles (a Qwen3-0.6B-shaped model on a CUDA GPU, a tiny model on CPU for ``--smoke``), the constants the
rows share, the random-init model a profile builds, and ``Row``/``Skip``/``run_row``: a row is ok, skipped (saying
why) or failed (saying what), so one failing part hides none of the others.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

REPO_ROOT = Path(__file__).resolve().parents[1]
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
    param_dtype: Literal["float32", "bfloat16"]  # the training step's FSDP2 param_dtype
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
        "rollout.train.n_samples": 2,
        "rollout.train.sampling_params": {"max_new_tokens": 8, "temperature": 1.0},
    },
    cpu_threads=1,  # a tiny model's ops are too small for threads; on a busy machine they cost 10x
)


class Skip(Exception):
    """A row that cannot run here; the message says why."""


@dataclass
class Row:
    """One line of the table: what was checked, how it went, and what it measured."""

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


def device_of(profile: Profile) -> Any:
    """The profile's torch device; Skip when it wants a CUDA GPU and none is visible."""
    import torch

    if profile.device == "cuda" and not torch.cuda.is_available():
        raise Skip("no CUDA GPU visible")
    return torch.device("cuda", 0) if profile.device == "cuda" else torch.device("cpu")


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
    shapes: dict[str, Any] = {**profile.model, "vocab_size": max(profile.model["vocab_size"], len(tokenizer))}
    config = Qwen3Config(
        **shapes,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).bfloat16()  # not .to(dtype): transformers types its wrapped .to() for mypy wrongly
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    return out
