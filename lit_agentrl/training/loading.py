"""Loading the policy: whole on one process; under FSDP2 sharded first, then filled from one copy on rank 0.

A rank that loaded the whole checkpoint before sharding it would hold a full fp32 copy (33 GB for an 8B model, per
rank, twice with a reference model). Instead every rank builds the model on the meta device, shards it, allocates
only its shards, and rank 0 alone reads the checkpoint and broadcasts it tensor by tensor, each rank keeping its
shard (``set_model_state_dict(..., broadcast_from_rank0=True)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from transformers import PreTrainedModel

from lit_agentrl.models.dtypes import torch_dtype
from lit_agentrl.models.skeleton import model_class


def load_pretrained(path: str) -> PreTrainedModel:
    """The whole model at ``path`` in fp32 on CPU; ``ValueError`` naming the path when there is none."""
    try:
        return model_class(path).from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model.model_path={path!r}: no loadable causal LM there ({exc})") from exc


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks FSDP2 shards one by one: the decoder layers (``model.layers``; a vision-language model's
    ``model.language_model.layers``) and a vision tower's blocks (``model.visual.blocks``)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        layers = getattr(getattr(inner, "language_model", None), "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__} has no `.model.layers` (or `.model.language_model.layers`) to shard per decoder "
            "layer"
        )
    blocks = getattr(getattr(inner, "visual", None), "blocks", None)
    return [*(blocks or []), *layers]


def fully_shard_layers(model: torch.nn.Module, mesh: Any, param_dtype: str) -> None:
    """FSDP2: shard every decoder layer (and vision block), then the root (embeddings, final norm, head, and a
    vision tower's patch embedding and merger)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch_dtype(param_dtype, "model.param_dtype"), reduce_dtype=torch.float32)
    for layer in shard_units(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def materialize_sharded(
    models: list[PreTrainedModel],
    path: str,
    device: torch.device,
    prepare: Callable[[PreTrainedModel], Any] | None = None,
) -> None:
    """Allocate the sharded meta ``models`` on ``device`` and fill them all from one copy of ``path`` on rank 0.

    Every rank must call this (the broadcast is collective). Buffers that checkpoints do not hold (rotary
    ``inv_freq``) are recomputed by transformers' own initialisation of those modules. ``prepare`` is applied to
    rank 0's copy first, as it was to the meta models (LoRA's adapters: their initial values are rank 0's).
    """
    for model in models:
        model.to_empty(device=device)
        _init_non_persistent_buffers(model)
    full: dict[str, torch.Tensor] = {}
    if dist.get_rank() == 0:
        loaded = load_pretrained(path)
        if prepare is not None:
            prepare(loaded)
        full = loaded.state_dict()
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    for model in models:
        set_model_state_dict(model, dict(full), options=options)  # it replaces the dict's values with the shards


def _init_non_persistent_buffers(model: PreTrainedModel) -> None:
    for module in model.modules():
        if module._non_persistent_buffers_set:
            model._init_weights(module)
