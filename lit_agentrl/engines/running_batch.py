"""The transformers engine's running batch: the rows decoded together and their shared KV cache.

Kept apart from the scheduler (:mod:`lit_agentrl.engines.hf`) because it changes for a different reason: how
KV is laid out and grown (a transformers ``DynamicCache`` detail), not how requests are admitted or sampled.

Continuous batching changes the batch all the time: in a multi-turn rollout a row joins whenever a tool returns
and leaves whenever a turn ends. So the KV lives in buffers with spare rows and columns (:class:`BatchLayer`), and
neither a join nor a leave copies the rows that stay (concatenating or selecting the whole cache cost a fifth of
the engine's time in a multi-turn rollout).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from lit_agentrl.engines.prefix_cache import CachedPrefix, LayerKV

R = TypeVar("R")


class BatchLayer(DynamicLayer):
    """One layer's keys and values for a batch: the view ``buffer[:rows, :, start:end]`` of larger buffers.

    Every row ends at column ``end`` (its padding sits at the left, masked out), so a forward writes its tokens'
    columns for all rows at once. Rows join in spare rows, right-aligned, and leave by having the last rows moved
    into their place: only the rows that move are copied, and only outgrowing the buffers copies everything.
    Padding columns are zeros, never stale values: a masked column weighs 0 in attention, but 0 times a stale NaN
    would not be 0. Made empty (as ``DynamicCache`` makes its layers); the first update brings the rows.
    """

    keys: torch.Tensor  # the batch's view (transformers types a layer's tensors as optional)
    values: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.rows, self.start, self.end = 0, 0, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized, self.device = True, key_states.device
        self._key_buffer = key_states.new_empty((0, key_states.shape[1], 0, key_states.shape[3]))
        self._value_buffer = value_states.new_empty((0, value_states.shape[1], 0, value_states.shape[3]))
        self._view()

    @property
    def width(self) -> int:
        return self.end - self.start

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A forward's keys and values, written after every row's last column; returns the batch's whole KV."""
        if not self.is_initialized:  # the first update brings the rows themselves
            self.lazy_initialization(key_states, value_states)
            self.join(key_states, value_states)
            return self._view()
        new = key_states.shape[-2]
        if self.end + new > self._key_buffer.shape[-2]:
            self._reallocate(self.rows, 0, new)
        self._key_buffer[: self.rows, :, self.end : self.end + new] = key_states
        self._value_buffer[: self.rows, :, self.end : self.end + new] = value_states
        self.end += new
        return self._view()

    def join(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append rows (their KV right-aligned in ``keys``/``values``, [n, kv_heads, w, d]) after the current ones."""
        first = self.rows
        self._open(keys.shape[0], keys.shape[-2])
        self._write(slice(first, self.rows), keys, values)

    def join_rows(self, rows: list[LayerKV | None], width: int) -> None:
        """Append rows given one by one (each [kv_heads, T, d], or None for no tokens), ``width`` columns wide."""
        first = self.rows
        self._open(len(rows), width)
        for row, kv in enumerate(rows, start=first):
            keys, values = (kv[0].unsqueeze(0), kv[1].unsqueeze(0)) if kv is not None else (None, None)
            self._write(slice(row, row + 1), keys, values)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (repeats allowed), in that order: for copies of one prompt prefilled once."""
        keys, values = self.keys.index_select(0, index), self.values.index_select(0, index)
        self.rows, self.start, self.end = 0, 0, 0
        self.lazy_initialization(keys, values)
        self.join(keys, values)

    def leave(self, holes: list[int], movers: list[int], rows: int, trim: int) -> None:
        """Move rows ``movers`` into rows ``holes``, keep the first ``rows`` rows, drop ``trim`` padding columns."""
        if holes:
            to, source = torch.tensor(holes, device=self.device), torch.tensor(movers, device=self.device)
            for buffer in (self._key_buffer, self._value_buffer):
                window = buffer[:, :, self.start : self.end]
                window.index_copy_(0, to, window.index_select(0, source))
        self.rows, self.start = rows, self.start + trim
        self._view()

    def _open(self, count: int, wide: int) -> None:
        """Make room for ``count`` more rows at least ``wide`` columns wide (their contents: the caller's to write)."""
        extra = max(0, wide - self.width)  # columns the batch must grow by at its left
        if self.rows + count > self._key_buffer.shape[0] or extra > self.start:
            self._reallocate(self.rows + count, extra, 0)
        if extra:  # the rows already here get that many more padding columns
            self._key_buffer[: self.rows, :, self.start - extra : self.start] = 0
            self._value_buffer[: self.rows, :, self.start - extra : self.start] = 0
            self.start -= extra
        self.rows += count
        self._view()

    def _write(self, rows: slice, keys: torch.Tensor | None, values: torch.Tensor | None) -> None:
        """Fill ``rows`` right-aligned with ``keys``/``values`` ([n, kv_heads, T, d]; None: no tokens), zeros before."""
        tokens = keys.shape[-2] if keys is not None else 0
        split = self.end - tokens
        self._key_buffer[rows, :, self.start : split] = 0
        self._value_buffer[rows, :, self.start : split] = 0
        if keys is not None and values is not None:
            self._key_buffer[rows, :, split : self.end] = keys
            self._value_buffer[rows, :, split : self.end] = values

    def _reallocate(self, rows: int, left: int, right: int) -> None:
        """Fresh buffers for at least ``rows`` rows and ``left``/``right`` more columns, with room to spare."""
        width = self.width + left + right
        room_rows = rows + max(4, rows // 4)
        room_left, room_right = max(16, width // 4), max(64, width // 2)
        buffers = []
        for old in (self._key_buffer, self._value_buffer):
            # Uninitialised: the batch's view is always written before it is read, padding included (``_write``),
            # and room never touched costs no memory.
            buffer = old.new_empty((room_rows, old.shape[1], room_left + width + room_right, old.shape[3]))
            start = room_left + left
            buffer[: self.rows, :, start : start + self.width] = old[: self.rows, :, self.start : self.end]
            buffers.append(buffer)
        self._key_buffer, self._value_buffer = buffers
        self.start, self.end = room_left + left, room_left + left + self.width

    def _view(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = self._key_buffer[: self.rows, :, self.start : self.end]
        self.values = self._value_buffer[: self.rows, :, self.start : self.end]
        return self.keys, self.values


def batch_cache() -> DynamicCache:
    """An empty ``DynamicCache`` whose layers are :class:`BatchLayer`\\ s, made by the first forward."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = BatchLayer
    return cache


def cache_with_prefixes(cached: list[CachedPrefix | None], width: int) -> DynamicCache:
    """A batch cache holding each row's cached prefix (None: none), right-aligned in ``width`` columns: what a
    prefill of the rows' remaining tokens continues."""
    cache = batch_cache()
    if width == 0:
        return cache
    template = next(c for c in cached if c is not None).kv
    for index, (keys, values) in enumerate(template):
        layer = BatchLayer()
        layer.lazy_initialization(keys.unsqueeze(0), values.unsqueeze(0))
        layer.join_rows([c.kv[index] if c is not None else None for c in cached], width)
        cache.layers.append(layer)
    return cache


def batch_layers(cache: DynamicCache) -> list[BatchLayer]:
    """A :func:`batch_cache`'s layers, typed (transformers types them as any layer kind)."""
    return cast("list[BatchLayer]", cache.layers)


def select_rows(cache: DynamicCache, index: torch.Tensor) -> None:
    """Keep the batch cache's rows ``index`` (repeats allowed), in that order."""
    for layer in batch_layers(cache):
        layer.select_rows(index)


class RunningBatch(Generic[R]):
    """The rows being decoded together: their requests, a shared KV cache and its attention mask.

    Rows are aligned to the cache's right edge: a row's padding sits at the left, masked out. Rows that finish
    leave at once and the last rows take their places, so the order of the rows is not the order they came in.
    """

    def __init__(self) -> None:
        self.requests: list[R] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [B, L]

    def _state(self) -> tuple[DynamicCache, torch.Tensor]:
        assert self.cache is not None and self.mask is not None, "the running batch has no rows"
        return self.cache, self.mask

    def _layers(self) -> list[BatchLayer]:
        cache, _ = self._state()
        return batch_layers(cache)

    def merge(self, requests: list[R], cache: DynamicCache, mask: torch.Tensor) -> None:
        """Append freshly prefilled rows: ``cache`` (a :func:`batch_cache`) and ``mask`` as the prefill left them."""
        assert all(isinstance(layer, BatchLayer) for layer in cache.layers), "merge takes a batch_cache()"
        if self.cache is None:  # the prefill's buffers become the batch's
            self.requests, self.cache, self.mask = list(requests), cache, mask
            return
        _, own_mask = self._state()
        for layer, new in zip(self._layers(), batch_layers(cache)):
            layer.join(new.keys, new.values)
        width = self._layers()[0].width
        self.mask = torch.cat([left_pad(own_mask, width, 1), left_pad(mask, width, 1)], dim=0)
        self.requests.extend(requests)

    def step_mask(self) -> torch.Tensor:
        """The mask grown by the column of the token this decode step feeds (kept as the batch's mask)."""
        _, mask = self._state()
        self.mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        return self.mask

    def row_kv(self, row: int) -> list[LayerKV]:
        """One row's keys and values over its real (unmasked) tokens, per layer: [kv_heads, T, head_dim]."""
        _, mask = self._state()
        columns = mask[row].nonzero().squeeze(-1)
        return [
            (layer.keys[row].index_select(1, columns), layer.values[row].index_select(1, columns))
            for layer in self._layers()
        ]

    def drop(self, rows: list[int]) -> None:
        """Remove finished rows, moving the last rows into their places, and the columns that were padding for
        every row left."""
        leaving = set(rows)
        remaining = len(self.requests) - len(leaving)
        if remaining == 0:
            self.requests, self.cache, self.mask = [], None, None
            return
        holes = sorted(r for r in leaving if r < remaining)
        movers = [r for r in range(remaining, len(self.requests)) if r not in leaving]
        _, mask = self._state()
        for hole, mover in zip(holes, movers):
            self.requests[hole] = self.requests[mover]
        del self.requests[remaining:]
        if holes:
            mask = mask.clone()
            mask[holes] = mask[movers]
        mask = mask[:remaining]
        trim = int(mask.any(dim=0).int().argmax())  # columns that are padding for every remaining row
        self.mask = mask[:, trim:]
        for layer in self._layers():
            layer.leave(holes, movers, remaining, trim)


def left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` with zeros prepended along ``dim`` up to ``width`` (itself when already that wide)."""
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
