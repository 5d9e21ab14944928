"""The KV of finished requests, kept for the requests that extend them.

An agent's next turn resends the whole conversation: the previous request's prompt and output, then the
tool or user turn. Keeping each finished request's keys and values lets the engine prefill only the new
tokens, as SGLang's radix cache does. Entries are whole sequences (one per trajectory in flight), matched by
prefix, evicted least recently used past a byte budget, and must be flushed whenever the weights change.

Images: a vision-language request's image tokens are the same placeholder id whatever the image, so equal token ids
do not mean equal KV. Each entry keeps the digests of its images (its ``scope``); a request reuses it only when its
own images begin with those.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]  # keys, values: [kv_heads, T, head_dim]


class CachedPrefix(NamedTuple):
    length: int  # tokens whose KV is reused
    kv: list[LayerKV]  # per layer, truncated to ``length``


class PrefixCache:
    """Finished sequences' KV by token ids, within ``max_bytes``.

    Example::

        cache = PrefixCache(256 << 20)
        cache.store(prompt + output[:-1], kv)            # every token the model was fed
        hit = cache.pop_longest_prefix(prompt + output + next_turn)   # hit.length == len(prompt + output) - 1
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"prefix cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        # (images' digests, token ids) -> KV
        self._entries: OrderedDict[tuple[tuple[str, ...], tuple[int, ...]], list[LayerKV]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def store(self, token_ids: list[int], kv: list[LayerKV], scope: tuple[str, ...] = ()) -> None:
        """Keep ``kv`` (one [kv_heads, len(token_ids), head_dim] pair per layer) for ``token_ids`` and the digests
        of the images among them (``scope``)."""
        size = _nbytes(kv)
        if not token_ids or size > self.max_bytes:
            return
        key = (tuple(scope), tuple(token_ids))
        if key in self._entries:
            self._bytes -= _nbytes(self._entries.pop(key))
        self._entries[key] = kv
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= _nbytes(evicted)

    def pop_longest_prefix(self, token_ids: list[int], scope: tuple[str, ...] = ()) -> CachedPrefix | None:
        """The longest entry that ``token_ids`` starts with, removed (the request will store its extension).

        At most ``len(token_ids) - 1`` tokens are reused: the last one must be fed to get next-token logits. An entry
        with images matches only a request whose image digests (``scope``) begin with the entry's.
        """
        ids, scope = tuple(token_ids), tuple(scope)
        best: tuple[tuple[str, ...], tuple[int, ...]] | None = None
        for key in self._entries:
            images, key_ids = key
            if (
                (best is None or len(key_ids) > len(best[1]))
                and len(key_ids) <= len(ids)
                and ids[: len(key_ids)] == key_ids
                and scope[: len(images)] == images
            ):
                best = key
        if best is None:
            return None
        kv = self._entries.pop(best)
        self._bytes -= _nbytes(kv)
        length = min(len(best[1]), len(token_ids) - 1)
        if length <= 0:
            return None
        self.hits += 1
        self.reused_tokens += length
        return CachedPrefix(length, [(k[:, :length], v[:, :length]) for k, v in kv])

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0


def _nbytes(kv: list[LayerKV]) -> int:
    return sum(k.nbytes + v.nbytes for k, v in kv)
