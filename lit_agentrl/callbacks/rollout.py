"""RolloutCallback: Lightning's hooks adapted to the rollout side (:mod:`lit_agentrl.rollout`).

Before each training step the engines are brought up to date (:class:`~lit_agentrl.rollout.fleet.EngineFleet`) and
the step's rollout is attached to the batch (:class:`~lit_agentrl.rollout.loop.RolloutLoop`); its metrics are logged
and checked (:class:`~lit_agentrl.rollout.health.RolloutHealth`). After the step the weights are pushed, now or before
the next rollout. Validation batches get their rollouts the same way.
"""

from __future__ import annotations

import gc
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from lit_agentrl.callbacks.rollout_wiring import RolloutSettings, build_rollout, grpo_module, prompt_data, steps_left
from lit_agentrl.config.rollout import EngineSettings
from lit_agentrl.engines import RolloutEngine, SamplingParams
from lit_agentrl.rollout.colocation import PhaseMemory
from lit_agentrl.rollout.fleet import EngineFleet
from lit_agentrl.rollout.health import RolloutHealth
from lit_agentrl.rollout.loop import RolloutLoop
from lit_agentrl.rollout.manager import DEFAULT_TRAJECTORY_TIMEOUT_S
from lit_agentrl.rollout.metrics import RolloutMetrics
from lit_agentrl.rollout.schedule import AsyncRollouts


class RolloutCallback(Callback):
    """Drive agent rollouts through rollout engines and keep their weights equal to the policy's.

    Args:
        engine: the rank's engines, by name (``engine: sglang``) or as the group ``{name, kwargs, modules,
            max_inflight, sync_bucket_mb, colocate, offload_trainer}`` (``lit_agentrl.config.rollout.EngineSettings``).
        n_samples: trajectories per training prompt (the GRPO group size).
        sampling_params: SGLang-style sampling parameters of training rollouts.
        val_n_samples: trajectories per validation prompt.
        val_sampling_params: sampling parameters of validation rollouts.
        trajectory_timeout_s: a trajectory running longer is cancelled, its engine requests aborted, and marked failed
            (left out of the loss). Default 1800 s; null: no limit, on purpose.
        check_template_drift: count ``rollout/template_drift`` (one template render per trajectory; not logged when
            off).
        max_failed_fraction: stop the run when more than this fraction of a step's trajectories (over all
            ranks) failed, quoting the most common reasons, instead of training on what is left.
        flat_reward_warn_steps: warn (naming the likely causes) when every prompt group's rewards have been equal
            for this many steps in a row, as a missing ground truth or the wrong reward function makes them (0: off).
        async_rollouts: generate the next steps' rollouts while this step trains: how far ahead, whether weight pushes
            land in requests in flight, whether a step leaves its long tail to the next one
            (``lit_agentrl.rollout.schedule.AsyncRollouts``). None (default): each step's rollout, then its
            update, then the weight sync.

    The reward function is the data module's ``reward_fn``. Example (YAML, under ``trainer.callbacks``)::

        - class_path: lit_agentrl.callbacks.RolloutCallback
          init_args: {n_samples: 8, sampling_params: {max_new_tokens: 256, temperature: 1.0}}
    """

    def __init__(
        self,
        engine: EngineSettings | str = "transformers",
        n_samples: int = 8,
        sampling_params: dict[str, Any] | None = None,
        val_n_samples: int = 1,
        val_sampling_params: dict[str, Any] | None = None,
        trajectory_timeout_s: float | None = DEFAULT_TRAJECTORY_TIMEOUT_S,
        check_template_drift: bool = True,
        max_failed_fraction: float = 0.5,
        flat_reward_warn_steps: int = 5,
        async_rollouts: AsyncRollouts | None = None,
    ) -> None:
        self.settings = RolloutSettings(
            engine=EngineSettings(name=engine) if isinstance(engine, str) else engine,
            n_samples=n_samples,
            sampling=SamplingParams.of(sampling_params, where="RolloutCallback.sampling_params"),
            val_n_samples=val_n_samples,
            val_sampling=SamplingParams.of(val_sampling_params, where="RolloutCallback.val_sampling_params"),
            trajectory_timeout_s=trajectory_timeout_s,
            check_template_drift=check_template_drift,
            async_rollouts=async_rollouts,
        )
        self.health = RolloutHealth(max_failed_fraction, flat_reward_warn_steps)
        self.metrics = RolloutMetrics(measures_drift=check_template_drift)
        self.loop: RolloutLoop | None = None
        self.fleet: EngineFleet | None = None
        self._restored: dict[str, Any] | None = None

    @property
    def engines(self) -> list[RolloutEngine]:
        """This rank's engines (none before setup or after teardown)."""
        return self.fleet.engines if self.fleet is not None else []

    # ------------------------------------------------------------------ lifecycle

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.loop is not None:
            return
        self.loop, self.fleet = build_rollout(self.settings, trainer, grpo_module(pl_module))
        self.health.collective = self.loop.collective
        self._apply_restored()
        self.metrics.to(pl_module.device)
        # Everything loaded so far (torch, transformers, LangGraph, the models) lives for the whole run: keep it out
        # of the garbage collector's full passes, which otherwise rescan it during every rollout's agent work
        # (measured: 0.3-0.5 s of a 128-trajectory multi-turn rollout). Unfrozen at teardown, so it can be freed.
        gc.collect()
        gc.freeze()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.loop is not None:
            self.loop.close()
        if self.fleet is not None:
            self.fleet.shutdown()
        self.loop = self.fleet = None
        gc.unfreeze()

    # ------------------------------------------------------------------ training

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        loop, fleet = self._parts()
        memory = PhaseMemory(pl_module.device)
        memory.start()
        self._prepare(trainer, pl_module)
        phases = memory.finish("sync")
        memory.start()
        busy = fleet.busy_seconds()
        step = loop.train(batch, trainer.global_step, steps_left(trainer), prompt_data(trainer))
        busy_after = fleet.busy_seconds()
        if busy is not None and busy_after is not None and self.settings.async_rollouts is None:  # async: ahead too
            pl_module.log("time/generation_s", busy_after - busy, on_step=True, batch_size=1)
        phases.update(memory.finish("rollout"))
        offloaded = fleet.close_window()  # colocated: the training step gets the memory back (SGLang must be idle)
        if offloaded is not None:
            phases["memory/offloaded_gb"] = offloaded
        memory.start()  # the training step's peak, logged at its end
        metrics = self.metrics.compute(step.generated, step.seconds)
        self.health.check(trainer.global_step, step.rollout, step.generated, metrics)
        pl_module.log_dict({**metrics, **phases, **step.metrics}, on_step=True, batch_size=1)
        pl_module.log(
            "rollout/reward", metrics["rollout/reward_mean"], on_step=True, prog_bar=True, logger=False, batch_size=1
        )
        pl_module.log("time/rollout_s", step.seconds, on_step=True, prog_bar=True, batch_size=1)
        pl_module.log("time/reward_s", step.rollout.stats.reward_seconds, on_step=True, batch_size=1)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loop, fleet = self._parts()
        pl_module.log_dict(PhaseMemory(pl_module.device).finish("train"), on_step=True, batch_size=1)
        loop.step_trained()
        fleet.stale = True
        # Colocated: before the next rollout, in the window that gives the engine the GPU. Async without partial
        # rollouts: before the next rollout too, once those in flight have finished on the weights they began with.
        if not self.settings.engine.colocate and loop.pushes_after_step:
            self._prepare(trainer, pl_module)

    # ------------------------------------------------------------------ validation

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._prepare(trainer, pl_module)
        self._parts()[0].validate(batch, trainer.global_step, batch_idx)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._parts()[1].close_window()  # colocated: the trainer resident again before checkpoints and training

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        loop_state = self.loop.state_dict() if self.loop is not None else {}
        return {"totals": dict(self.health.totals), **loop_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.health.totals.update(state_dict.get("totals", {}))
        self._restored = dict(state_dict)
        self._apply_restored()
        rank_zero_info(
            "RolloutCallback: the engines will be re-synced with the restored policy before the first rollout"
        )

    # ------------------------------------------------------------------ helpers

    def _parts(self) -> tuple[RolloutLoop, EngineFleet]:
        if self.loop is None or self.fleet is None:
            raise RuntimeError("RolloutCallback.setup has not run: the callback must be in trainer.callbacks")
        return self.loop, self.fleet

    def _prepare(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The engines at the policy's weights before they generate (in colocated mode, a window opened)."""
        loop, fleet = self._parts()
        seconds = fleet.prepare(pl_module.device, grpo_module(pl_module).policy, loop.version, loop.before_push)
        if seconds is not None:
            self.health.totals["syncs"] += 1
            if trainer.training:
                pl_module.log("time/sync_s", seconds, on_step=True, batch_size=1)

    def _apply_restored(self) -> None:
        """A checkpoint's state, once the loop exists (Lightning restores callbacks after their setup)."""
        if self._restored is None or self.loop is None or self.fleet is None:
            return
        self.loop.load_state_dict(self._restored)
        self.fleet.stale = True  # the engines still hold the initial weights; the restored policy differs
        self._restored = None
