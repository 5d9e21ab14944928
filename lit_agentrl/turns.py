"""The model turns of a token sequence, and a key for the exact context each turn was generated in.

A multi-turn trajectory is one token list: the prompt, then model turns (``loss_mask`` 1) with the tool, user and
template tokens between them (``loss_mask`` 0). The turn-level advantage estimators
(:mod:`lit_agentrl.training.advantage_estimators`) credit each turn on its own; these functions say where the turns
are and which turns of a group were generated from the same context (GiGPO's anchor state).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import torch

ANCHOR_BYTES = 16
"""Digest size of :func:`turn_anchor`: 128 bits, so a batch's anchors collide with probability ~ n^2 / 2^129."""


def turn_spans(loss_mask: Sequence[int], prompt_len: int) -> list[tuple[int, int]]:
    """The model turns of a sequence: each maximal run of 1s in ``loss_mask``, as ``(start, end)`` (end exclusive).

    The prompt (the first ``prompt_len`` positions) carries no 1s. Two model turns with no 0 between them read as
    one turn; chat templates always put the turn's closing and the next header's tokens (mask 0) between them.
    """
    if not 0 <= prompt_len <= len(loss_mask):
        raise ValueError(f"prompt_len {prompt_len} is outside the loss_mask of {len(loss_mask)} entries")
    bad = next((i for i, m in enumerate(loss_mask) if m not in (0, 1)), None)
    if bad is not None:
        raise ValueError(f"loss_mask[{bad}] is {loss_mask[bad]!r}; a loss mask holds only 0 and 1")
    if any(loss_mask[:prompt_len]):
        raise ValueError(f"loss_mask has a 1 inside the prompt (its first {prompt_len} positions)")
    spans: list[tuple[int, int]] = []
    start = None
    for i in range(prompt_len, len(loss_mask)):
        if loss_mask[i] and start is None:
            start = i
        elif not loss_mask[i] and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    return spans


def turn_anchor(all_token_ids: Sequence[int], start: int, images: bytes = b"") -> bytes:
    """A key of the exact context before the turn starting at ``start``: ``all_token_ids[:start]`` and ``images``, the
    bytes of the images whose placeholder tokens lie in that prefix (:func:`context_images`; their tokens alone are
    the same for any two images of one size).

    Two turns have equal keys exactly when their contexts are identical (up to a 128-bit BLAKE2b collision). A hash,
    not the prefix tuple itself: a batch holds one anchor per turn, and the tuples would hold every turn's whole
    context again (turns x context length ints); Python's own ``hash`` is 64 bits and not collision-resistant, so
    equal hashes of different contexts would silently merge step groups. Each id is packed as 8 little-endian bytes
    (a fixed width, so the encoding is injective, and the same on every machine).
    """
    if not 0 <= start <= len(all_token_ids):
        raise ValueError(f"turn start {start} is outside the {len(all_token_ids)} token ids")
    prefix = all_token_ids[:start]
    try:
        packed = struct.pack(f"<{len(prefix)}q", *prefix)
    except struct.error as exc:
        raise ValueError(f"token ids before position {start} must be integers of at most 64 bits: {exc}") from None
    # The prefix's length first: the images' bytes that follow cannot then pass for token ids.
    return hashlib.blake2b(struct.pack("<q", len(prefix)) + packed + images, digest_size=ANCHOR_BYTES).digest()


def context_images(
    all_token_ids: Sequence[int], start: int, images: Mapping[str, Any], vision: tuple[int, int]
) -> bytes:
    """The bytes of the images a context ``all_token_ids[:start]`` shows: the rows of ``pixel_values`` and
    ``image_grid_thw`` of the images whose placeholders it holds (a Qwen2-VL-family policy's ``(image_token_id,
    spatial_merge_size)``: each image is ``t * h * w`` patch rows and ``t * h * w / merge**2`` placeholders, in
    order). Fixed-length prefixes of the same arrays for equal contexts; different bytes for different pixels."""
    token, merge = vision
    grids = torch.as_tensor(images["image_grid_thw"]).long().reshape(-1, 3)
    placeholders = sum(1 for i in all_token_ids[:start] if i == token)
    sizes = grids.prod(dim=1).tolist()  # patch rows per image
    shown, patches, tokens = 0, 0, 0
    while shown < len(sizes) and tokens < placeholders:
        patches, tokens = patches + sizes[shown], tokens + sizes[shown] // merge**2
        shown += 1
    if tokens != placeholders:
        raise ValueError(
            f"the context before position {start} holds {placeholders} image placeholders (id {token}), which is no "
            f"whole number of the trajectory's images (image_grid_thw {grids.tolist()}, merge {merge})"
        )
    pixels = torch.as_tensor(images["pixel_values"])[:patches].contiguous()
    return grids[:shown].numpy().tobytes() + pixels.reshape(-1).view(torch.uint8).numpy().tobytes()
