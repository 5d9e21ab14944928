"""What the rollout loop needs from the other ranks, without Lightning: sums and maxima, gathers, barriers.

``RolloutCallback`` hands the loop and the engine fleet the trainer's strategy through :class:`Collective`; tests
and single-process tools use :class:`SingleProcess`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

ReduceOp = Literal["sum", "max"]


class Collective(Protocol):
    """The ranks of one run, as the rollout side sees them. Every rank calls each method together."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def reduce(self, value: float, op: ReduceOp) -> float:
        """``value`` summed or maximised over all ranks."""
        ...

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        ...

    def barrier(self, name: str) -> None:
        """Wait for every rank."""
        ...


class SingleProcess:
    """One rank alone: reductions and gathers of its own values."""

    rank = 0
    world_size = 1

    def reduce(self, value: float, op: ReduceOp) -> float:
        return value

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self, name: str) -> None:
        return None
