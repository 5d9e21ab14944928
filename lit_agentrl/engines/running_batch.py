"""The transformers engine's running batch: the rows decoded together and their shared, growing KV cache.

Kept apart from the scheduler (:mod:`lit_agentrl.engines.hf`) because it changes for a different reason: how
KV is laid out and grown (a transformers ``DynamicCache`` detail), not how requests are admitted or sampled.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from lit_agentrl.engines.prefix_cache import CachedPrefix, LayerKV

R = TypeVar("R")


class KVLayer(Protocol):
    """One initialised full-attention cache layer: [B, kv_heads, T, head_dim] keys and values."""

    keys: torch.Tensor
    values: torch.Tensor


def kv_layers(cache: DynamicCache) -> list[KVLayer]:
    """The cache's layers with their tensors typed (transformers types them as optional, and as any layer kind)."""
    return cast("list[KVLayer]", cache.layers)


class RunningBatch(Generic[R]):
    """The rows being decoded together: their requests, a shared KV cache and its attention mask.

    Rows are left-aligned to the cache's right edge: a row's padding sits at the left, masked out.
    """

    def __init__(self) -> None:
        self.requests: list[R] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [B, L]

    def _state(self) -> tuple[DynamicCache, torch.Tensor]:
        assert self.cache is not None and self.mask is not None, "the running batch has no rows"
        return self.cache, self.mask

    def merge(self, requests: list[R], cache: DynamicCache, mask: torch.Tensor) -> None:
        """Append freshly prefilled rows, left-padding the narrower of the two caches to the wider."""
        if self.cache is None:
            self.requests, self.cache, self.mask = list(requests), cache, mask
            return
        own_cache, own_mask = self._state()
        width = max(own_mask.shape[1], mask.shape[1])
        for old, new in zip(kv_layers(own_cache), kv_layers(cache)):
            old.keys = torch.cat([left_pad(old.keys, width, -2), left_pad(new.keys, width, -2)], dim=0)
            old.values = torch.cat([left_pad(old.values, width, -2), left_pad(new.values, width, -2)], dim=0)
        self.mask = torch.cat([left_pad(own_mask, width, 1), left_pad(mask, width, 1)], dim=0)
        self.requests.extend(requests)

    def step_mask(self) -> torch.Tensor:
        """The mask grown by the column of the token this decode step feeds (kept as the batch's mask)."""
        _, mask = self._state()
        self.mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        return self.mask

    def row_kv(self, row: int) -> list[LayerKV]:
        """One row's keys and values over its real (unmasked) tokens, per layer: [kv_heads, T, head_dim]."""
        cache, mask = self._state()
        columns = mask[row].nonzero().squeeze(-1)
        return [
            (layer.keys[row].index_select(1, columns), layer.values[row].index_select(1, columns))
            for layer in kv_layers(cache)
        ]

    def drop(self, rows: list[int]) -> None:
        """Remove finished rows, and the columns that were padding for every row left."""
        keep = [i for i in range(len(self.requests)) if i not in set(rows)]
        self.requests = [self.requests[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, None
            return
        cache, mask = self._state()
        index = torch.tensor(keep, device=mask.device)
        # Columns that are padding for every remaining row no longer need to be attended over.
        mask = mask.index_select(0, index)
        first = int(mask.any(dim=0).int().argmax())
        self.mask = mask[:, first:]
        for layer in kv_layers(cache):
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]


class GrowingLayer(DynamicLayer):
    """A KV cache layer that writes each step into spare room instead of concatenating.

    ``DynamicLayer`` copies the whole cache at every decode step (``torch.cat``), which costs as much as the
    attention itself on long rows. Here ``keys``/``values`` are views into larger buffers, so a step writes
    only its new tokens; whenever the running batch replaces the tensors (rows joining or leaving), the next
    update moves them into a fresh buffer with room to grow.
    """

    def __init__(self) -> None:
        super().__init__()
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys and values after the cached ones; returns the whole cached keys and values."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
        keys, values = self.keys, self.values
        assert keys is not None and values is not None  # set by the first update, above
        used, new = keys.shape[-2], key_states.shape[-2]
        if not self._owns_room_for(keys, values, used + new):
            room = used + new + max(64, (used + new) // 2)
            self._key_buffer = self._grown(keys, room)
            self._value_buffer = self._grown(values, room)
        key_buffer, value_buffer = self._key_buffer, self._value_buffer
        assert key_buffer is not None and value_buffer is not None
        key_buffer[:, :, used : used + new] = key_states
        value_buffer[:, :, used : used + new] = value_states
        self.keys, self.values = key_buffer[:, :, : used + new], value_buffer[:, :, : used + new]
        return self.keys, self.values

    def _owns_room_for(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> bool:
        buffer, value_buffer = self._key_buffer, self._value_buffer
        return (
            buffer is not None
            and value_buffer is not None
            and buffer.shape[-2] >= length
            and keys.data_ptr() == buffer.data_ptr()
            and values.data_ptr() == value_buffer.data_ptr()
            and keys.shape[0] == buffer.shape[0]
        )

    @staticmethod
    def _grown(t: torch.Tensor, room: int) -> torch.Tensor:
        buffer = t.new_empty((t.shape[0], t.shape[1], room, t.shape[3]))
        buffer[:, :, : t.shape[-2]] = t
        return buffer


def growing_cache() -> DynamicCache:
    """An empty ``DynamicCache`` whose layers are :class:`GrowingLayer`\\ s."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


def stack_prefixes(cached: list[CachedPrefix | None], width: int, device: torch.device) -> list[LayerKV]:
    """Per layer, the rows' cached keys and values left-padded with zeros to ``width``: [B, kv_heads, width, d]."""
    template = next(c for c in cached if c is not None).kv
    layers: list[LayerKV] = []
    for index, (keys, _) in enumerate(template):
        empty = keys.new_zeros((keys.shape[0], 0, keys.shape[2]))
        parts = [(c.kv[index] if c is not None else (empty, empty)) for c in cached]
        stacked = [torch.stack([left_pad(t[i], width, 1) for t in parts]).to(device) for i in (0, 1)]
        layers.append((stacked[0], stacked[1]))
    return layers


def left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` with zeros prepended along ``dim`` up to ``width`` (itself when already that wide)."""
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
