"""Rows 1 and 2 of scripts/gpu_checks.py: the FSDP2 training step's tokens/s, MFU and peak memory, and the
transformers engine's generation tokens/s."""

from __future__ import annotations

import gc
import math
import socket
import time
from pathlib import Path
from typing import Any

from gpu_profiles import GB, Profile, device_of


def num_params(model_dir: Path) -> int:
    """The model's parameters, tied embeddings counted once (what MFU's 6 x params x tokens counts)."""
    from lit_agentrl.plan import model_shapes

    return model_shapes(str(model_dir)).num_params


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
    """A TCP port free on localhost now, for the one-process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    compute = Compute(micro_batch_tokens=profile.micro_batch_tokens, param_dtype=profile.param_dtype)
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
