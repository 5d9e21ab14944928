"""Seeds of rollouts and engine sampling streams, keyed by where they are in a run rather than by when they ran.

A rollout's seed is keyed by (run seed, rank, phase, the batch's place in the data), so it is the same whether the
rollout runs at its step (sync) or ahead of it (async), in an unbroken run or a resumed one; an engine's streams are
reseeded by (run seed, rank, step, phase, engine), so a resumed run samples what an unbroken one would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.types import PromptBatch


def key_hash(key: str) -> int:
    """A 64-bit seed from a text key, the same in every process and run."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


@dataclass(frozen=True)
class RolloutSeeds:
    """The seeds of one rank of one run (``base``: the run's seed, as ``seed_everything`` set it)."""

    base: int
    rank: int

    def rollout(self, phase: str, batch: PromptBatch) -> int:
        """The seed of ``batch``'s rollout in ``phase`` (``train``, ``extra-<round>``, ``carried``, ``val-<step>``)."""
        return key_hash(f"{self.base}/{self.rank}/{phase}/{batch.epoch}/{batch.index}") >> 1

    def reseed(self, engines: Sequence[RolloutEngine], step: int, phase: str) -> None:
        """Restart the engines' sampling streams for ``phase`` of ``step`` (a no-op for engines that cannot, SGLang)."""
        key = f"{self.base}/{self.rank}/{step}/{phase}"
        for index, engine in enumerate(engines):
            engine.reseed(key_hash(f"{key}/{index}"))
