"""RolloutCallback: Lightning's hooks adapted to the rollout side, a Lightning-free
:class:`~lit_agentrl.rollout.step.RolloutStep` (sync the engines, generate, check, push).

Before each training step the engines are brought up to date and the step's rollout is attached to the batch; its
metrics are logged. After the step the weights are pushed, now or before the next rollout. Validation batches get
their rollouts the same way, and each validation ends with its ``pass@k`` table.
"""

from __future__ import annotations

import gc
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from lit_agentrl.callbacks.rollout_wiring import build_rollout, prompt_data, rollout_policy, steps_left
from lit_agentrl.callbacks.validation_report import ValidationReport
from lit_agentrl.config.rollout import (
    AsyncRollouts,
    EngineSettings,
    Health,
    Rewards,
    RolloutSettings,
    TrainRollouts,
    ValidationRollouts,
)
from lit_agentrl.engines import RolloutEngine
from lit_agentrl.rollout.health import RolloutHealth
from lit_agentrl.rollout.metrics import RolloutMetrics
from lit_agentrl.rollout.step import RolloutStep


class RolloutCallback(Callback):
    """Drive agent rollouts through rollout engines and keep their weights equal to the policy's.

    Args:
        engine: the rank's engines, by name (``engine: sglang``) or as the group ``{name, kwargs, modules,
            max_inflight, sync_bucket_mb, colocate, offload_trainer}`` (``lit_agentrl.config.rollout.EngineSettings``).
        train: the trained rollouts: ``{n_samples, sampling_params, dynamic_sampling}``
            (``lit_agentrl.config.rollout.TrainRollouts``).
        validation: the validation's rollouts and figures: ``{n_samples, sampling_params, pass_k}``
            (``lit_agentrl.config.rollout.ValidationRollouts``).
        reward: the default reward function, by name (``reward: math``) or as ``{fn}``
            (``lit_agentrl.config.rollout.Rewards``).
        health: failing trajectories: ``{trajectory_timeout_s, max_failed_fraction, flat_reward_warn_steps,
            template_drift}`` (``lit_agentrl.config.rollout.Health``).
        async_rollouts: generate the next steps' rollouts while this step trains (``{ahead, partial, ready_fraction,
            max_staleness}``, ``lit_agentrl.config.rollout.AsyncRollouts``). None (default): each step's rollout,
            then its update, then the weight sync.

    Example (YAML, under ``trainer.callbacks``)::

        - class_path: lit_agentrl.callbacks.RolloutCallback
          init_args:
            train: {n_samples: 8, sampling_params: {max_new_tokens: 256, temperature: 1.0}}
            reward: math
    """

    def __init__(
        self,
        engine: EngineSettings | str = "transformers",
        train: TrainRollouts = TrainRollouts(),
        validation: ValidationRollouts = ValidationRollouts(),
        reward: Rewards | str | None = None,
        health: Health = Health(),
        async_rollouts: AsyncRollouts | None = None,
    ) -> None:
        self.settings = RolloutSettings(
            engine=EngineSettings(name=engine) if isinstance(engine, str) else engine,
            train=train,
            validation=validation,
            reward=reward if isinstance(reward, Rewards) else Rewards(fn=reward),
            health=health,
            async_rollouts=async_rollouts,
        )
        self.health = RolloutHealth(health.max_failed_fraction, health.flat_reward_warn_steps)
        self.metrics = RolloutMetrics(measures_drift=health.template_drift)
        self.report = ValidationReport(validation.pass_k, self.settings.reward.fn)
        self.step: RolloutStep | None = None
        self._restored: dict[str, Any] | None = None

    @property
    def engines(self) -> list[RolloutEngine]:
        """This rank's engines (none before setup or after teardown)."""
        return self.step.fleet.engines if self.step is not None else []

    # ------------------------------------------------------------------ lifecycle

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.step is not None:
            return
        self.step = build_rollout(
            self.settings, trainer, rollout_policy(pl_module), pl_module.device, self.health, self.metrics
        )
        self._apply_restored()
        self.metrics.to(pl_module.device)
        # Everything loaded so far (torch, transformers, LangGraph, the models) lives for the whole run: keep it out
        # of the garbage collector's full passes, which otherwise rescan it during every rollout's agent work
        # (measured: 0.3-0.5 s of a 128-trajectory multi-turn rollout). Unfrozen at teardown, so it can be freed.
        gc.collect()
        gc.freeze()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.step is not None:
            self.step.close()
        self.step = None
        gc.unfreeze()

    # ------------------------------------------------------------------ training

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        policy = rollout_policy(pl_module).policy
        logged = self._step().before_update(
            batch, trainer.global_step, steps_left(trainer), prompt_data(trainer), pl_module.device, policy
        )
        rollout_seconds = logged.pop("time/rollout_s")  # logged with the bar's figures
        pl_module.log_dict(logged, on_step=True, batch_size=1)
        reward = logged["rollout/reward_mean"]
        pl_module.log("rollout/reward", reward, on_step=True, prog_bar=True, logger=False, batch_size=1)
        pl_module.log("time/rollout_s", rollout_seconds, on_step=True, prog_bar=True, batch_size=1)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        logged = self._step().after_update(pl_module.device, rollout_policy(pl_module).policy)
        pl_module.log_dict(logged, on_step=True, batch_size=1)

    # ------------------------------------------------------------------ validation

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report.start()

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        policy = rollout_policy(pl_module).policy
        self._step().validate(batch, trainer.global_step, batch_idx, pl_module.device, policy)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.report.update(batch)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report.finish(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step().fleet.close_window()  # colocated: the trainer resident again before checkpoints and training

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        loop_state = self.step.loop.state_dict() if self.step is not None else {}
        return {"totals": dict(self.health.totals), **loop_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.health.totals.update(state_dict.get("totals", {}))
        self._restored = dict(state_dict)
        self._apply_restored()
        rank_zero_info(
            "RolloutCallback: the engines will be re-synced with the restored policy before the first rollout"
        )

    # ------------------------------------------------------------------ helpers

    def _step(self) -> RolloutStep:
        if self.step is None:
            raise RuntimeError("RolloutCallback.setup has not run: the callback must be in trainer.callbacks")
        return self.step

    def _apply_restored(self) -> None:
        """A checkpoint's state, once the step exists (Lightning restores callbacks after their setup)."""
        if self._restored is None or self.step is None:
            return
        self.step.loop.load_state_dict(self._restored)
        self.step.fleet.stale = True  # the engines still hold the initial weights; the restored policy differs
        self._restored = None
