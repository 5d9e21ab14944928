"""Push the policy's weights into a rollout engine: full tensors gathered in buckets, one bucket at a time.

Under FSDP2 every parameter is a DTensor shard; ``full_tensor()`` all-gathers it, so every rank must walk
the parameters in the same order. Buckets bound the memory held at once to about ``bucket_bytes``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from lit_agentrl.engines.base import RolloutEngine


def full_named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter as a full (unsharded) detached tensor, by its state-dict name; tied weights once."""
    for name, param in model.named_parameters():
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        yield name, tensor


def buckets(named: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors into lists of about ``bucket_bytes`` (a larger tensor forms a bucket of its own)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def sync_weights(
    model: torch.nn.Module,
    engines: list[RolloutEngine],
    bucket_bytes: int = 512 << 20,
    weight_version: int | None = None,
) -> int:
    """Copy every parameter of ``model`` into each engine; returns the number of tensors gathered.

    Every rank must call this (gathering is collective), with the engines it owns (none: it gathers without
    sending, as a rank whose engine another rank updates). Each engine gets one weight-update session
    (``begin_weight_update``/``end_weight_update``, SGLang's; a no-op elsewhere) around all buckets. Raises
    ``RuntimeError`` with the engine's message when an update fails. ``weight_version`` (training steps in the
    weights) is set on each engine inside its session, with the weights.
    """
    for engine in engines:
        engine.begin_weight_update()
    gathered = 0
    try:
        for bucket in buckets(full_named_parameters(model), bucket_bytes):
            for engine in engines:
                ok, message = engine.update_weights_from_tensor(bucket, flush_cache=False)
                if not ok:
                    raise RuntimeError(f"weight sync failed after {gathered} tensors: {message}")
            gathered += len(bucket)
        if weight_version is not None:
            for engine in engines:
                engine.weight_version = weight_version
        for engine in engines:  # inside the session: a paused engine's requests continue without the old prefixes
            if not engine.flush_cache():
                raise RuntimeError(f"weight sync: {type(engine).__name__} kept the old weights' prefix cache")
    finally:
        for engine in engines:
            engine.end_weight_update()
    return gathered
