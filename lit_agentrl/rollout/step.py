"""RolloutStep: the rollout side of one training step, without Lightning.

Before the update: the engines brought to the policy's weights (:class:`~lit_agentrl.rollout.fleet.EngineFleet`), the
step's rollout attached to the batch (:class:`~lit_agentrl.rollout.loop.RolloutLoop`), a colocated engine's window
closed, the rollout's metrics computed and checked (:class:`~lit_agentrl.rollout.health.RolloutHealth`). After it:
one weight version newer, pushed now or before the next rollout. Each call returns the metrics to log;
``RolloutCallback`` adapts Lightning's hooks to it, and tests drive it with no Trainer.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from lit_agentrl.rollout.colocation import PhaseMemory
from lit_agentrl.rollout.fleet import EngineFleet
from lit_agentrl.rollout.health import RolloutHealth
from lit_agentrl.rollout.loop import RolloutLoop, TrainData
from lit_agentrl.rollout.metrics import RolloutMetrics
from lit_agentrl.types import PromptBatch

Metrics = dict[str, float]


class RolloutStep:
    """One rank's rollout side of each training step and validation batch.

    Args:
        loop: which rollout each step trains on.
        fleet: this rank's engines and their weights.
        health: the failure checks and the run's totals.
        metrics: the ``rollout/*`` figures of a step.
        colocate: the engines share the trainer's GPU (weights are pushed inside the window before each rollout).
    """

    def __init__(
        self, loop: RolloutLoop, fleet: EngineFleet, health: RolloutHealth, metrics: RolloutMetrics, colocate: bool
    ) -> None:
        self.loop, self.fleet, self.health, self.metrics = loop, fleet, health, metrics
        self.colocate = colocate
        self._train_memory: PhaseMemory | None = None
        self._step_started: float | None = None

    def sync(self, device: torch.device, policy: torch.nn.Module) -> float | None:
        """The engines at the policy's weights before they generate (colocated: a window opened); the push's seconds,
        or None when the engines were already up to date."""
        seconds = self.fleet.prepare(device, policy, self.loop.version, self.loop.before_push)
        if seconds is not None:
            self.health.totals["syncs"] += 1
        return seconds

    def before_update(
        self,
        batch: PromptBatch,
        step: int,
        steps_left: int,
        data: TrainData | None,
        device: torch.device,
        policy: torch.nn.Module,
    ) -> Metrics:
        """Sync, generate the step's rollout onto ``batch``, give a colocated trainer its memory back, and check the
        rollout (raising when too many trajectories failed); the step's metrics."""
        logged = self._step_wall()
        memory = PhaseMemory(device)
        memory.start()
        sync_seconds = self.sync(device, policy)
        logged |= memory.finish("sync") | self._pushed(sync_seconds)
        memory.start()
        busy = self.fleet.busy_seconds()
        rollout = self.loop.train(batch, step, steps_left, data)
        busy_after = self.fleet.busy_seconds()
        if busy is not None and busy_after is not None and self.loop.ahead is None:  # ahead: other steps' work too
            logged["time/generation_s"] = busy_after - busy
        logged |= memory.finish("rollout")
        offloaded = self.fleet.close_window()  # colocated: the update gets the memory back (SGLang must be idle)
        if offloaded is not None:
            logged["memory/offloaded_gb"] = offloaded
        self._train_memory = PhaseMemory(device)
        self._train_memory.start()  # the update's peak, reported by after_update
        metrics = self.metrics.compute(rollout.generated, rollout.seconds)
        self.health.check(step, rollout.rollout, rollout.generated, metrics)
        return {
            **metrics,
            **logged,
            **rollout.metrics,
            "time/rollout_s": rollout.seconds,
            "time/reward_s": rollout.rollout.stats.reward_seconds,
        }

    def after_update(self, device: torch.device, policy: torch.nn.Module) -> Metrics:
        """The policy is one update newer: push it now, unless colocated or waiting for the rollouts in flight (then
        before the next rollout); the update's memory and the push's seconds."""
        logged = self._train_memory.finish("train") if self._train_memory is not None else {}
        self._train_memory = None
        self.loop.step_trained()
        self.fleet.stale = True
        if not self.colocate and self.loop.pushes_after_step:
            logged |= self._pushed(self.sync(device, policy))
        return logged

    def validate(self, batch: PromptBatch, step: int, batch_idx: int, device: torch.device, policy: Any) -> None:
        """A validation batch's rollout onto ``batch``, on the policy's current weights."""
        self.sync(device, policy)
        self.loop.validate(batch, step, batch_idx)

    def _step_wall(self) -> Metrics:
        """``time/step_s``: the wall seconds from the previous step's start to this one's (all it took, whatever
        overlapped: waiting for its rollout, the update, the push, a validation), logged with this step."""
        now = time.perf_counter()
        started, self._step_started = self._step_started, now
        return {} if started is None else {"time/step_s": now - started}

    def _pushed(self, seconds: float | None) -> Metrics:
        """``time/sync_s`` and ``sync/bytes`` (to each engine this rank pushes to) of a push, if there was one."""
        if seconds is None:
            return {}
        return {"time/sync_s": seconds, "sync/bytes": float(self.fleet.pushed_bytes)}

    def close(self) -> None:
        """Stop the rollouts and shut the engines down."""
        self.loop.close()
        self.fleet.shutdown()
