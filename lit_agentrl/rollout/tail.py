"""A step that does not wait for its rollout's long tail (``async_rollouts: {partial: true, ready_fraction: f}``).

The step's prompt groups are generated as one rollout whose groups finish one by one (:class:`GroupedRollout`). Once
``f`` of them have finished, the step trains on those, together with the groups the previous step left running
(waited for in full: they had a step's time more); the unfinished ones keep generating, on the new weights after
the step's push, and are trained with the next step (:class:`Carried`). A trajectory carried over is one update
older when it is trained (its staleness counts it), so carrying adds one to the staleness the schedule produces (``AsyncRollouts.staleness``) beyond how far
ahead the rollouts run. The carried groups' place in the data is checkpointed: a resumed run regenerates them.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from dataclasses import dataclass
from typing import Any

from lit_agentrl.types import Trajectory


class GroupedRollout:
    """One rollout as a future per prompt group (its ``n`` trajectories), taken as they finish."""

    def __init__(self, futures: list[concurrent.futures.Future[list[Trajectory]]]) -> None:
        self.futures = futures
        self.started = time.perf_counter()
        self.taken: set[int] = set()

    def wait_finished(self, count: int) -> list[int]:
        """Block until at least ``count`` groups have finished; the finished ones not taken yet, in group order."""
        count = min(count, len(self.futures))
        while sum(f.done() for f in self.futures) < count:
            running = [f for f in self.futures if not f.done()]
            concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
        return [g for g, f in enumerate(self.futures) if f.done() and g not in self.taken]

    def take(self, groups: list[int]) -> list[Trajectory]:
        """The trajectories of ``groups`` (waiting for those still running), group by group."""
        self.taken.update(groups)
        return [t for g in groups for t in self.futures[g].result()]

    def unfinished(self) -> list[int]:
        return [g for g in range(len(self.futures)) if g not in self.taken]

    def cancel(self) -> None:
        for future in self.futures:
            future.cancel()


@dataclass
class Carried:
    """Groups a step left running, trained with the next step: their rows and their indices in ``rollout``."""

    rollout: GroupedRollout
    rows: list[dict[str, Any]]
    groups: list[int]
    key: tuple[int, int]
    """(epoch, index) of the batch they came from."""


@dataclass
class StepGroups:
    """What a step trains when it does not wait for its tail: the rows and trajectories (groups renumbered to index
    ``rows``), and the groups it leaves running."""

    rows: list[dict[str, Any]]
    trajectories: list[Trajectory]
    carried: Carried | None
    carried_in: int
    """Groups trained now that the step before had left running."""
    waited: float
    seconds: float
    """Wall time from the start of the step's own rollout to now."""


def take_ready(
    rows: list[dict[str, Any]],
    rollout: GroupedRollout,
    key: tuple[int, int],
    ready_fraction: float,
    carried: Carried | None,
) -> StepGroups:
    """The groups carried from the step before (all of them), then the step's own finished groups once at least
    ``ready_fraction`` of them have finished; the rest carried on."""
    start = time.perf_counter()
    before = carried.rollout.take(carried.groups) if carried is not None else []
    ready = rollout.wait_finished(math.ceil(ready_fraction * len(rows)))
    own = rollout.take(ready)
    waited = time.perf_counter() - start
    previous_rows = carried.rows if carried is not None else []
    _renumber(before, carried.groups if carried is not None else [], 0)  # groups index the rows trained
    _renumber(own, ready, len(previous_rows))
    left = rollout.unfinished()
    next_carried = Carried(rollout, [rows[g] for g in left], left, key) if left else None
    return StepGroups(
        rows=[*previous_rows, *(rows[g] for g in ready)],
        trajectories=[*before, *own],
        carried=next_carried,
        carried_in=len(previous_rows),
        waited=waited,
        seconds=time.perf_counter() - rollout.started,
    )


def _renumber(trajectories: list[Trajectory], groups: list[int], first: int) -> None:
    """Number the trajectories of ``groups`` (in that order) from ``first``."""
    position = {group: first + k for k, group in enumerate(groups)}
    for t in trajectories:
        t.group = position[t.group]
