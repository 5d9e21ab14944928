"""RolloutLoop: which rollout each step trains on, without Lightning.

A step's rollout is generated at the step (sync), with extra rounds for DAPO's dynamic sampling, or taken from the
rollouts generated ahead while earlier steps trained (:class:`~lit_agentrl.config.rollout.AsyncRollouts`), with
the groups an earlier step left running (``ready_fraction``). The loop seeds every rollout and the engines' streams
by where they are in the run (:mod:`lit_agentrl.rollout.seeds`), keeps the weight version (updates in the policy's
weights) and the carried groups' place in the data, and checkpoints both.

``RolloutCallback`` adapts Lightning's hooks to it; tests drive it with scripted engines and no Trainer.
"""

from __future__ import annotations

import base64
import pickle
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from lit_agentrl.config.rollout import AsyncRollouts, TrainRollouts, ValidationRollouts
from lit_agentrl.errors import UserInputError
from lit_agentrl.rollout.ahead import RolloutsAhead, batch_key, split_stale
from lit_agentrl.rollout.collective import Collective, SingleProcess
from lit_agentrl.rollout.dynamic import dynamic_rollout
from lit_agentrl.rollout.manager import RolloutManager, summarize
from lit_agentrl.rollout.seeds import RolloutSeeds
from lit_agentrl.rollout.tail import Carried, GroupedRollout, take_ready
from lit_agentrl.types import PromptBatch, RolloutBatch, Trajectory


class BatchSource(Protocol):
    """The training batches in data order (``AgentPromptDataModule.train_dataloader()``)."""

    def batch_after(self, batch: PromptBatch, ahead: int) -> PromptBatch: ...

    def batch_at(self, epoch: int, index: int) -> PromptBatch: ...


class TrainData(Protocol):
    """What the loop reads from the data module (``AgentPromptDataModule``)."""

    def draw_extra_train_rows(self) -> list[dict[str, Any]]: ...

    def train_dataloader(self) -> Any: ...


@dataclass
class StepRollout:
    """What one training step gets: the rollout it trains on (``batch.rollout``), every trajectory generated for it
    (for the rollout metrics), the schedule's metrics, and the rollout's wall time."""

    rollout: RolloutBatch
    generated: list[Trajectory]
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)


class RolloutLoop:
    """The rollouts of a run's steps and validations, on one rank.

    Args:
        manager: runs the agents against the engines.
        seeds: this rank's rollout and stream seeds.
        train: trajectories per training prompt, their sampling parameters, dynamic sampling.
        validation: trajectories per validation prompt and their sampling parameters.
        schedule: rollouts generated ahead of training (None: each step's rollout at the step).
        collective: the other ranks (dynamic sampling's counts, the async metrics, the carried groups).
    """

    def __init__(
        self,
        manager: RolloutManager,
        seeds: RolloutSeeds,
        train: TrainRollouts,
        validation: ValidationRollouts | None = None,
        schedule: AsyncRollouts | None = None,
        collective: Collective | None = None,
    ) -> None:
        self.manager, self.seeds, self.schedule = manager, seeds, schedule
        self.collective = collective or SingleProcess()
        self.train_settings, self.validation_settings = train, validation or ValidationRollouts()
        self.ahead = RolloutsAhead(schedule.ahead) if schedule is not None else None
        self.version = 0
        """Updates in the policy's weights: the weight version pushed into the engines (checkpointed)."""
        self.carried: Carried | None = None  # groups the last step left running
        self.carried_state: dict[str, Any] | None = None  # where they are in the data, on every rank (checkpointed)
        self._carried_to_restore: dict[str, Any] | None = None
        self._rewards_seen = 0.0

    # ------------------------------------------------------------------ steps

    def train(self, batch: PromptBatch, step: int, steps_left: int, data: TrainData | None = None) -> StepRollout:
        """The rollout step ``step`` trains on (attached to ``batch``; with dynamic sampling or carried groups,
        ``batch.rows`` become the rows trained). ``steps_left``: training steps left in the run, this one included
        (the rollouts ahead stop at the run's end)."""
        self.seeds.reseed(self.manager.engines, step, "train")
        if self.ahead is not None:
            if data is None:
                raise UserInputError("RolloutCallback.async_rollouts needs the data module AgentPromptDataModule")
            return self._take_ahead(batch, steps_left, data.train_dataloader())
        start = time.perf_counter()
        dynamic = self.train_settings.dynamic_sampling
        if dynamic is None:
            batch.rollout = self._generate(batch.rows, self.seeds.rollout("train", batch))
            return StepRollout(batch.rollout, batch.rollout.trajectories, time.perf_counter() - start)

        def generate(rows: Any, round_: int) -> RolloutBatch:
            if round_:
                self.seeds.reseed(self.manager.engines, step, f"train-extra-{round_}")
            return self._generate(rows, self.seeds.rollout(f"extra-{round_}", batch))

        def global_sum(value: float) -> float:
            return self.collective.reduce(value, "sum")

        if data is None:
            raise UserInputError("RolloutCallback.train.dynamic_sampling needs the data module AgentPromptDataModule")
        result = dynamic_rollout(batch.rows, generate, data.draw_extra_train_rows, global_sum, dynamic.max_rounds)
        batch.rows, batch.rollout = cast("list[dict[str, Any]]", list(result.rows)), result.rollout
        metrics = {
            "rollout/dynamic_rounds": float(result.rounds),  # the same on every rank
            "rollout/dropped_groups": global_sum(float(result.dropped_groups)),
        }
        return StepRollout(result.rollout, result.generated, time.perf_counter() - start, metrics)

    def validate(self, batch: PromptBatch, step: int, batch_idx: int) -> RolloutBatch:
        """A validation batch's rollout, attached to ``batch``."""
        self.seeds.reseed(self.manager.engines, step, f"val-{batch_idx}")
        seed = self.seeds.rollout(f"val-{step}", batch)
        settings = self.validation_settings
        batch.rollout = self.manager.generate(batch.rows, settings.n_samples, settings.sampling, seed)
        return batch.rollout

    def step_trained(self) -> None:
        """The policy has taken this step's update: one weight version newer."""
        self.version += 1

    @property
    def pushes_after_step(self) -> bool:
        """Whether the weights go to the engines right after a step (else before the next rollout: without partial
        rollouts, once the rollouts in flight have finished on the weights they began with)."""
        return self.schedule is None or self.schedule.partial

    def before_push(self) -> None:
        """Without partial rollouts, wait until every request in flight has finished on its weights."""
        if self.ahead is not None and not self.pushes_after_step:
            self.ahead.wait_all()

    def close(self) -> None:
        """Cancel the rollouts ahead and the carried groups; stop the manager."""
        if self.ahead is not None:
            self.ahead.cancel()
        if self.carried is not None:  # the last step's tail: the run ends before a step could train it
            self.carried.rollout.cancel()
            self.carried = None
        self.manager.close()

    # ------------------------------------------------------------------ asynchronous schedule

    def _generate(self, rows: Any, seed: int) -> RolloutBatch:
        return self.manager.generate(rows, self.train_settings.n_samples, self.train_settings.sampling, seed)

    def _submit(self, batch: PromptBatch) -> Any:
        send = self.manager.submit_groups if self._carries else self.manager.submit
        settings = self.train_settings
        return send(batch.rows, settings.n_samples, settings.sampling, self.seeds.rollout("train", batch))

    @property
    def _carries(self) -> bool:
        return self.schedule is not None and self.schedule.carries

    def _take_ahead(self, batch: PromptBatch, steps_left: int, loader: BatchSource) -> StepRollout:
        """The batch's rollout (generated ahead, or now), the next ones started, stale trajectories dropped."""
        assert self.ahead is not None and self.schedule is not None
        reduce = self.collective.reduce
        metrics: dict[str, float] = {}
        if self._carries:
            rollout, waited, metrics = self._take_ready(batch, self.ahead.pop(batch, self._submit), loader)
        else:
            rollout, waited = self.ahead.take(batch, self._submit)
        self.ahead.fill(batch, loader.batch_after, self._submit, limit=steps_left - 1)
        staleness = split_stale(rollout.trajectories, self.version, self.schedule.dropped_beyond)
        batch.rollout = RolloutBatch(staleness.kept, rollout.stats, rollout.temperature)
        values = [float(v) for v in staleness.values]
        count = reduce(float(len(values)), "sum")
        metrics |= {
            "rollout/staleness_mean": reduce(sum(values), "sum") / max(count, 1.0),
            "rollout/staleness_max": reduce(max(values, default=0.0), "max"),
            "rollout/dropped_stale": reduce(float(staleness.dropped), "sum"),
            "rollout/partial_frac": reduce(float(staleness.partial), "sum") / max(count, 1.0),
            "time/wait_rollout_s": waited,
        }
        return StepRollout(batch.rollout, rollout.trajectories, rollout.stats.seconds, metrics)

    def _take_ready(
        self, batch: PromptBatch, grouped: GroupedRollout, loader: BatchSource
    ) -> tuple[RolloutBatch, float, dict[str, float]]:
        """The groups the step before left running and this batch's finished ones, the rest carried on
        (``batch.rows`` become the rows trained); the rollout, the wait, and the carry metrics."""
        assert self.schedule is not None
        self._restore_carried(loader)
        step = take_ready(batch.rows, grouped, batch_key(batch), self.schedule.ready_fraction, self.carried)
        batch.rows, self.carried = step.rows, step.carried
        stats = summarize(step.trajectories, step.seconds)
        rewards = self.manager.reward_seconds
        stats.reward_seconds, self._rewards_seen = rewards - self._rewards_seen, rewards
        self._note_carried(batch)
        metrics = {
            "rollout/carried_groups": self.collective.reduce(
                float(len(self.carried.groups) if self.carried else 0), "sum"
            ),
            "rollout/carried_in": self.collective.reduce(float(step.carried_in), "sum"),
        }
        return RolloutBatch(step.trajectories, stats, self.train_settings.sampling.temperature), step.waited, metrics

    def _note_carried(self, batch: PromptBatch) -> None:
        """Record which groups of ``batch`` every rank carries on, for the checkpoint (a resumed run regenerates
        them); the same on every rank."""
        everyone = self.collective.all_gather(list(self.carried.groups) if self.carried is not None else [])
        self.carried_state = {"epoch": batch.epoch, "index": batch.index, "groups": everyone} if any(everyone) else None

    def _restore_carried(self, loader: BatchSource) -> None:
        """After a resume: regenerate the groups the checkpointed step had left running, for this step to train."""
        state, self._carried_to_restore = self._carried_to_restore, None
        if state is None or self.carried is not None:
            return
        groups = state["groups"]
        if len(groups) != self.collective.world_size:
            raise UserInputError(
                f"cannot resume the carried rollout groups: the checkpoint was taken with {len(groups)} processes, "
                f"this run has {self.collective.world_size}"
            )
        source = loader.batch_at(state["epoch"], state["index"])
        rows = [source.rows[g] for g in groups[self.collective.rank]]
        seed = self.seeds.rollout("carried", source)
        rollout = self.manager.submit_groups(rows, self.train_settings.n_samples, self.train_settings.sampling, seed)
        self.carried = Carried(rollout, rows, list(range(len(rows))), batch_key(source))

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The weight version, the carried groups' place in the data, and every rank's rollouts in flight, finished
        (called on every rank: the rollouts are gathered, so rank 0's checkpoint holds all of them)."""
        state: dict[str, Any] = {"trained_steps": self.version, "carried": self.carried_state}
        if self.ahead is not None and not self._carries:
            state["ahead"] = self.collective.all_gather(encode_rollouts(self.ahead.finished()))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.version = int(state.get("trained_steps", 0))
        self._restore_ahead(state.get("ahead"))
        self._carried_to_restore = state.get("carried")
        if self._carried_to_restore is not None and not self._carries and self.collective.rank == 0:
            groups = sum(len(g) for g in self._carried_to_restore["groups"])
            warnings.warn(
                f"RolloutCallback: the checkpoint's step left {groups} prompt group(s) running for the next step "
                "(ready_fraction < 1); this run does not carry groups and will not train them",
                stacklevel=2,
            )

    def _restore_ahead(self, everyone: list[dict[str, str]] | None) -> None:
        """This rank's rollouts in flight at the checkpoint, pending again for their steps."""
        if not everyone or self.ahead is None or self._carries:
            return
        if len(everyone) != self.collective.world_size:
            raise UserInputError(
                f"cannot resume the rollouts in flight: the checkpoint was taken with {len(everyone)} processes, "
                f"this run has {self.collective.world_size}"
            )
        self.ahead.restore(decode_rollouts(everyone[self.collective.rank]))


def encode_rollouts(rollouts: Mapping[tuple[int, int], RolloutBatch]) -> dict[str, str]:
    """Rollouts by batch key as checkpoint-safe strings (``"epoch/index"`` -> pickled, base64): a checkpoint loaded with
    ``weights_only`` takes strings where it refuses arbitrary objects."""
    return {f"{e}/{i}": base64.b64encode(pickle.dumps(r)).decode("ascii") for (e, i), r in rollouts.items()}


def decode_rollouts(encoded: Mapping[str, str]) -> dict[tuple[int, int], RolloutBatch]:
    rollouts = {}
    for key, text in encoded.items():
        epoch, index = key.split("/")
        rollouts[int(epoch), int(index)] = pickle.loads(base64.b64decode(text))  # the run's own checkpoint
    return rollouts
