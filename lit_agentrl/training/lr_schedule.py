"""The learning-rate schedule of ``model.optimizer``: warm-up, then constant or cosine."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["lr_factor"]


def lr_factor(kind: str, warmup: int, total: int) -> Callable[[int], float]:
    """LR factor per optimizer step: linear warm-up from 1/warmup, then constant or cosine down to 0.1.

    Not transformers' ``get_cosine_with_min_lr_schedule_with_warmup``: after warm-up its factors are these,
    but its warm-up starts at 0, so the first optimizer step (a whole rollout's worth) would not move the policy.
    """

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
