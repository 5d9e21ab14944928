"""After each step's rollout: its failures reported, flat rewards warned about, and the run stopped when too many
trajectories failed (``RolloutCallback.max_failed_fraction``). Counts over all ranks; messages on rank 0."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from lit_agentrl.errors import UserInputError
from lit_agentrl.rollout.collective import Collective, SingleProcess
from lit_agentrl.rollout.failure_report import FailureReport, first_tracebacks, reason_of
from lit_agentrl.rollout.flat_rewards import FlatRewardWatch
from lit_agentrl.types import RolloutBatch, Trajectory

log = logging.getLogger(__name__)


class RolloutHealth:
    """Checks each step's rollout metrics (``rollout/*``, already global) and keeps the run's totals (checkpointed).

    Args:
        max_failed_fraction: stop when more than this fraction of a step's trajectories (over all ranks) failed.
        flat_reward_warn_steps: warn when every group's rewards have been equal this many steps in a row (0: off).
        collective: the ranks (the failure reasons and tracebacks are gathered to rank 0).
    """

    def __init__(
        self, max_failed_fraction: float = 0.5, flat_reward_warn_steps: int = 5, collective: Collective | None = None
    ) -> None:
        if not 0.0 <= max_failed_fraction <= 1.0:
            raise UserInputError(f"max_failed_fraction must be in [0, 1], got {max_failed_fraction}")
        self.max_failed_fraction = max_failed_fraction
        self.flat_rewards = FlatRewardWatch(flat_reward_warn_steps)
        self.failure_report = FailureReport()
        self.collective = collective or SingleProcess()
        self.totals = {"rollouts": 0, "trajectories": 0, "failed": 0, "syncs": 0}

    def check(self, step: int, rollout: RolloutBatch, generated: list[Trajectory], metrics: dict[str, float]) -> None:
        """Count the step, report its failures, warn if rewards stay flat, and raise if too many failed."""
        self.totals["rollouts"] += 1
        self.totals["trajectories"] += len(generated)
        self.totals["failed"] += rollout.stats.num_failed
        self.report_failures(step, generated, metrics)
        warning = self.flat_rewards.update(
            metrics["rollout/flat_group_frac"], metrics["rollout/reward_min"], metrics["rollout/reward_max"]
        )
        if warning and self.collective.rank == 0:
            log.warning("step %d: %s", step, warning)
        total = metrics["rollout/trajectories"]
        if total and metrics["rollout/failed"] / total > self.max_failed_fraction:
            reasons = "; ".join(f"{n} x {reason}" for reason, n in rollout.stats.failure_reasons.most_common(3))
            raise RuntimeError(
                f"{metrics['rollout/failed']:.0f} of {total:.0f} trajectories failed this step, more than "
                f"max_failed_fraction={self.max_failed_fraction}; most common reasons on this rank: {reasons}"
            )

    def report_failures(self, step: int, trajectories: list[Trajectory], metrics: dict[str, float]) -> None:
        """Every step with failed trajectories, on rank 0: their counts by reason over all ranks, and the first
        traceback of each reason not seen before, in full (it ends with the line in the agent's file)."""
        if not metrics["rollout/failed"]:  # a global count: every rank skips the gather together
            return
        failed = [t for t in trajectories if t.failed]
        parts: list[Any] = self.collective.all_gather((Counter(map(reason_of, failed)), first_tracebacks(failed)))
        if self.collective.rank != 0:
            return
        reasons: Counter[str] = sum((counts for counts, _ in parts), Counter())
        tracebacks: dict[str, str] = {}
        for _, rank_tracebacks in parts:  # each reason's traceback from the lowest rank that saw it
            for reason, traceback in rank_tracebacks.items():
                tracebacks.setdefault(reason, traceback)
        failures, total = int(metrics["rollout/failed"]), int(metrics["rollout/trajectories"])
        log.warning("%s", self.failure_report.message(step, failures, total, reasons, tracebacks))
