"""Rollouts generated ahead of the steps that train on them (``RolloutCallback.async_rollouts: {ahead: N}``).

While step k trains, the rollouts of steps k+1 ... k+depth run on the engine (on the rollout manager's background
thread). Each is keyed by its batch's place in the data stream (epoch, index), which Lightning will fetch in order;
the loader's position only moves when a batch is trained. A checkpoint waits for the rollouts in flight and carries
them whole (:meth:`RolloutsAhead.finished`), so a run killed with rollouts in flight resumes with exactly the
trajectories the unbroken run trains: no prompt lost, repeated or generated again. A trajectory records the weight
versions it was generated with; one more than ``async_rollouts.max_staleness`` steps older than the policy that trains
on it is dropped and counted.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lit_agentrl.types import PromptBatch, RolloutBatch, Trajectory

BatchKey = tuple[int, int]
Submit = Callable[[PromptBatch], "concurrent.futures.Future[RolloutBatch]"]


@dataclass
class Staleness:
    """How old a step's trajectories were: steps between their oldest tokens' weights and the training policy."""

    kept: list[Trajectory]
    values: list[int]
    """Staleness of every trajectory that recorded its weight versions (kept or dropped)."""
    dropped: int
    partial: int
    """Trajectories continued across a weight update (their oldest and newest versions differ)."""


class RolloutsAhead:
    """The rollouts in flight for coming steps, by batch key.

    Args:
        depth: how many steps ahead to generate (0: each step's rollout starts when the step does, as in sync mode).
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.pending: dict[BatchKey, Any] = {}
        """Rollouts in flight by batch: futures of :class:`RolloutBatch`, or :class:`~lit_agentrl.rollout.tail.GroupedRollout`."""

    def pop(self, batch: PromptBatch, submit: Callable[[PromptBatch], Any]) -> Any:
        """The batch's rollout in flight (started now if it was not ahead), no longer pending."""
        return self.pending.pop(batch_key(batch), None) or submit(batch)

    def take(self, batch: PromptBatch, submit: Submit) -> tuple[RolloutBatch, float]:
        """The batch's rollout (started now if it was not ahead), and the seconds spent waiting for it."""
        future = self.pop(batch, submit)
        start = time.perf_counter()
        rollout = future.result()
        return rollout, time.perf_counter() - start

    def fill(
        self, batch: PromptBatch, after: Callable[[PromptBatch, int], PromptBatch], submit: Submit, limit: int
    ) -> None:
        """Start the rollouts of the ``depth`` batches after ``batch`` (at most ``limit``: the run's steps left) that
        are not running yet."""
        for ahead in range(1, min(self.depth, limit) + 1):
            coming = after(batch, ahead)
            if batch_key(coming) not in self.pending:
                self.pending[batch_key(coming)] = submit(coming)

    def finished(self) -> dict[BatchKey, RolloutBatch]:
        """Every rollout in flight, waited for (its results stay for its step): what a checkpoint carries, so that a
        resumed run trains them as they are instead of generating them again on newer weights."""
        return {key: future.result() for key, future in self.pending.items()}

    def restore(self, rollouts: dict[BatchKey, RolloutBatch]) -> None:
        """Rollouts a checkpoint carried, pending again for their steps."""
        for key, rollout in rollouts.items():
            future: concurrent.futures.Future[RolloutBatch] = concurrent.futures.Future()
            future.set_result(rollout)
            self.pending[key] = future

    def wait_all(self) -> None:
        """Wait until every rollout in flight has finished (their results stay for their steps)."""
        concurrent.futures.wait(self.pending.values())

    def cancel(self) -> None:
        for future in self.pending.values():
            future.cancel()
        self.pending.clear()


def split_stale(trajectories: list[Trajectory], version: int, max_staleness: int) -> Staleness:
    """Keep the trajectories at most ``max_staleness`` versions older than ``version``, the training policy's."""
    kept, values, dropped, partial = [], [], 0, 0
    for t in trajectories:
        if t.weight_versions is None:  # failed before generating, or an engine that records none
            kept.append(t)
            continue
        oldest, newest = t.weight_versions
        staleness = version - oldest
        values.append(staleness)
        partial += int(newest != oldest)
        if staleness > max_staleness:
            dropped += 1
        else:
            kept.append(t)
    return Staleness(kept, values, dropped, partial)


def batch_key(batch: PromptBatch) -> BatchKey:
    """(epoch, index): the batch's place in the data stream."""
    return batch.epoch, batch.index
