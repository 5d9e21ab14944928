"""Push the policy's weights into a rollout engine: full tensors gathered in buckets, one bucket at a time.

Under FSDP2 every parameter is a DTensor shard; ``full_tensor()`` all-gathers it, so every rank must walk
the parameters in the same order. Each gathered tensor is cast to the engines' weight dtype at once (a bf16 engine
gets half the bytes of the fp32 master weights), and a bucket holds at most ``bucket_bytes`` of them: the memory
held at once is one bucket and the largest tensor as gathered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch

from lit_agentrl.bridge.lora import adapter_config, adapter_named_parameters, merged_named_parameters
from lit_agentrl.config.training import Lora
from lit_agentrl.engines.base import RolloutEngine


class WeightSync(NamedTuple):
    """What one push moved: the tensors gathered, and the bytes each engine received (in its dtype)."""

    tensors: int
    bytes: int


def full_named_parameters(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter as a full (unsharded) detached tensor, by its state-dict name, cast to ``dtype`` when given;
    tied weights once."""
    for name, param in model.named_parameters():
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        yield name, tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def buckets(named: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors into lists of at most ``bucket_bytes``; a larger tensor goes alone."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def push_dtype(engines: list[RolloutEngine]) -> torch.dtype | None:
    """The dtype every engine holds its weights in, or None when they differ or one does not say."""
    dtypes = {engine.weight_dtype for engine in engines}
    return dtypes.pop() if len(dtypes) == 1 else None


def sync_weights(
    model: torch.nn.Module,
    engines: list[RolloutEngine],
    bucket_bytes: int = 512 << 20,
    weight_version: int | None = None,
    lora: Lora | None = None,
) -> WeightSync:
    """Copy every parameter of ``model`` into each engine; returns the tensors gathered and the bytes sent to each.

    Every rank must call this (gathering is collective), with the engines it owns (none: it gathers without
    sending, as a rank whose engine another rank updates). Tensors travel in the engines' ``weight_dtype``. Each
    engine gets one weight-update session (``begin_weight_update``/``end_weight_update``, SGLang's; a no-op
    elsewhere) around all buckets. Raises ``RuntimeError`` with the engine's message when an update fails.
    ``weight_version`` (training steps in the weights) is set on each engine inside its session, with the weights.
    With ``lora`` (the policy's adapters), the engines get the weights with the adapters merged in, or with
    ``lora.sync: adapter`` the adapters alone, which each engine swaps whole itself: no session, no cache flush.
    """
    if lora is not None and lora.syncs_adapter:
        gathered = _push_adapter(model, engines, lora)
        _set_version(engines, weight_version)
        return gathered
    for engine in engines:
        engine.begin_weight_update()
    gathered = WeightSync(0, 0)
    try:
        gathered = _push_weights(model, engines, bucket_bytes, lora)
        _set_version(engines, weight_version)
        for engine in engines:  # inside the session: a paused engine's requests continue without the old prefixes
            if not engine.flush_cache():
                raise RuntimeError(f"weight sync: {type(engine).__name__} kept the old weights' prefix cache")
    finally:
        for engine in engines:
            engine.end_weight_update()
    return gathered


def _set_version(engines: list[RolloutEngine], weight_version: int | None) -> None:
    if weight_version is not None:
        for engine in engines:
            engine.weight_version = weight_version


def _push_weights(
    model: torch.nn.Module, engines: list[RolloutEngine], bucket_bytes: int, lora: Lora | None
) -> WeightSync:
    dtype = push_dtype(engines)
    named = merged_named_parameters(model, dtype) if lora is not None else full_named_parameters(model, dtype)
    gathered = sent = 0
    for bucket in buckets(named, bucket_bytes):
        for engine in engines:
            ok, message = engine.update_weights_from_tensor(bucket, flush_cache=False)
            if not ok:
                raise RuntimeError(f"weight sync failed after {gathered} tensors: {message}")
        gathered += len(bucket)
        sent += _nbytes(bucket)
    return WeightSync(gathered, sent)


def _nbytes(tensors: list[tuple[str, torch.Tensor]]) -> int:
    return sum(tensor.numel() * tensor.element_size() for _, tensor in tensors)


def _push_adapter(model: torch.nn.Module, engines: list[RolloutEngine], lora: Lora) -> WeightSync:
    """The adapters alone (MBs where the weights are GBs), in one piece, in the engines' dtype: the engines serve
    them on their unchanged base (SGLang keys its prefix cache by adapter, the transformers engine clears its own)."""
    dtype = push_dtype(engines)
    tensors = [
        (name, tensor if dtype is None else tensor.to(dtype)) for name, tensor in adapter_named_parameters(model)
    ]
    config = adapter_config(lora)
    for engine in engines:
        ok, message = engine.load_lora_adapter(tensors, config)
        if not ok:
            raise RuntimeError(f"weight sync of the LoRA adapter failed: {message}")
    return WeightSync(len(tensors), _nbytes(tensors))
