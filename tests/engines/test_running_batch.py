"""The transformers engine's running batch: rows join, decode and leave without the rows that stay being copied,
and every row keeps exactly its own keys and values, whatever row it moves to."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from lit_agentrl.engines.running_batch import RunningBatch, batch_cache

HEADS, DIM, LAYERS = 2, 4, 2


def _prefilled(lengths: list[int], g: torch.Generator) -> tuple[DynamicCache, torch.Tensor, list[torch.Tensor]]:
    """A prefill's cache for rows of ``lengths`` tokens, right-aligned and zero-padded, and each row's real KV."""
    width = max(lengths)
    keys = torch.zeros(len(lengths), HEADS, width, DIM)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    rows = []
    for row, length in enumerate(lengths):
        kv = torch.randn(HEADS, length, DIM, generator=g)
        keys[row, :, width - length :] = kv
        mask[row, width - length :] = 1
        rows.append(kv)
    cache = batch_cache()
    real = mask[:, None, :, None]
    for layer in range(LAYERS):  # layer l holds kv + l, its values -(kv + l); padding stays zeros
        cache.update(keys + layer * real, -(keys + layer * real), layer)
    return cache, mask, rows


def _check(batch: RunningBatch, expected: dict[str, torch.Tensor]) -> None:
    assert sorted(batch.requests) == sorted(expected)
    assert batch.mask is not None and batch.cache is not None
    for row, name in enumerate(batch.requests):
        kv = batch.row_kv(row)
        for layer, (keys, values) in enumerate(kv):
            assert torch.equal(keys, expected[name] + layer) and torch.equal(values, -(expected[name] + layer))
        padding = batch.mask[row] == 0
        for layer in batch.cache.layers:  # padding is zeros: a masked column must weigh exactly 0
            assert not layer.keys[row][:, padding].any() and not layer.values[row][:, padding].any()


def _decode(batch: RunningBatch, expected: dict[str, torch.Tensor], g: torch.Generator) -> None:
    new = torch.randn(len(batch.requests), HEADS, 1, DIM, generator=g)
    batch.step_mask()
    assert batch.cache is not None
    for layer in range(LAYERS):
        batch.cache.update(new + layer, -(new + layer), layer)
    for row, name in enumerate(batch.requests):
        expected[name] = torch.cat([expected[name], new[row]], dim=1)


def test_rows_join_decode_and_leave_keeping_their_own_kv_without_copying_the_others():
    g = torch.Generator().manual_seed(0)
    batch: RunningBatch[str] = RunningBatch()
    expected: dict[str, torch.Tensor] = {}

    def join(names: list[str], lengths: list[int]) -> None:
        cache, mask, rows = _prefilled(lengths, g)
        batch.merge(names, cache, mask)
        expected.update(zip(names, rows))

    join(["a", "b", "c"], [3, 5, 2])
    _check(batch, expected)
    for _ in range(3):
        _decode(batch, expected, g)
    _check(batch, expected)
    join(["d", "e"], [12, 1])  # wider than the batch: the rows already there get more padding at the left
    _check(batch, expected)
    _decode(batch, expected, g)
    buffer = batch.cache.layers[0]._key_buffer
    stays = batch.requests.index("d")
    before = batch.cache.layers[0].keys[stays].clone()
    batch.drop([batch.requests.index("a"), batch.requests.index("e")])
    for name in ("a", "e"):
        del expected[name]
    _check(batch, expected)
    assert batch.cache.layers[0]._key_buffer is buffer  # no new buffer: only moved rows were copied
    assert torch.equal(batch.cache.layers[0].keys[batch.requests.index("d")][:, -before.shape[1] :], before)
    for _ in range(80):  # past the buffer's spare columns: it grows, keeping every row
        _decode(batch, expected, g)
    _check(batch, expected)
    batch.drop([batch.requests.index("d")])  # the widest row leaves: its padding columns go with it
    del expected["d"]
    _check(batch, expected)
    assert batch.mask is not None and batch.mask.shape[1] == max(t.shape[1] for t in expected.values())
    join([f"n{i}" for i in range(20)], [4] * 20)  # more rows than the buffer has spare
    _check(batch, expected)
    batch.drop(list(range(len(batch.requests))))
    assert batch.requests == [] and batch.cache is None and batch.mask is None


def test_a_row_joining_after_a_nan_row_left_sees_zeros_in_its_padding():
    g = torch.Generator().manual_seed(1)
    batch: RunningBatch[str] = RunningBatch()
    cache, mask, _ = _prefilled([6, 6], g)
    for layer in cache.layers:
        layer.keys[1] = float("nan")
    batch.merge(["ok", "nan"], cache, mask)
    batch.drop([1])
    cache, mask, _ = _prefilled([2], g)
    batch.merge(["short"], cache, mask)
    row = batch.requests.index("short")
    assert batch.cache is not None and batch.mask is not None
    keys = batch.cache.layers[0].keys[row]
    assert not keys.isnan().any() and torch.equal(keys[:, batch.mask[row] == 0], torch.zeros(HEADS, 4, DIM))
