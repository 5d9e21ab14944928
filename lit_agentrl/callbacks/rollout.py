"""RolloutCallback: Lightning's hooks adapted to the rollout side (:mod:`lit_agentrl.rollout`).

Before each training step the engines are brought up to date (:class:`~lit_agentrl.rollout.fleet.EngineFleet`) and
the step's rollout is attached to the batch (:class:`~lit_agentrl.rollout.loop.RolloutLoop`); its metrics are logged
and checked (:class:`~lit_agentrl.rollout.health.RolloutHealth`). After the step the weights are pushed, now or before
the next rollout. Validation batches get their rollouts the same way.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from lit_agentrl.callbacks.ranks import TrainerCollective, engine_placement
from lit_agentrl.callbacks.rollout_checks import check_async, check_module
from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.engines import RolloutEngine, SamplingParams, build_engines
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.processors import load_policy_processor, load_tokenizer
from lit_agentrl.registry import import_modules
from lit_agentrl.rollout.colocation import PhaseMemory
from lit_agentrl.rollout.fleet import EngineFleet
from lit_agentrl.rollout.health import RolloutHealth
from lit_agentrl.rollout.loop import RolloutLoop
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rollout.metrics import RolloutMetrics
from lit_agentrl.rollout.schedule import AsyncRollouts
from lit_agentrl.rollout.seeds import RolloutSeeds
from lit_agentrl.training.module import GRPOModule
from lit_agentrl.training.offload import TrainerOffload


class RolloutCallback(Callback):
    """Drive agent rollouts through rollout engines and keep their weights equal to the policy's.

    Args:
        engine: a registered engine name: ``transformers`` or ``sglang`` (one engine per rank), ``sglang_http``
            (already running SGLang servers shared by all ranks; rank 0 pushes the weights), or your own
            (``@register_engine("name")`` on a ``lit_agentrl.engines.RolloutEngine`` subclass).
        engine_kwargs: passed to the engine's constructor (e.g. ``max_running_requests``, ``dtype``,
            ``mem_fraction_static``; ``urls`` for ``sglang_http``).
        engine_modules: modules (dotted names or ``.py`` paths) imported at setup, before the engines are
            built, so the ``@register_engine`` of users' engines runs.
        n_samples: trajectories per training prompt (the GRPO group size).
        sampling_params: SGLang-style sampling parameters of training rollouts.
        val_n_samples: trajectories per validation prompt.
        val_sampling_params: sampling parameters of validation rollouts.
        max_inflight_per_engine: most trajectories in flight against the engine.
        trajectory_timeout_s: a trajectory running longer is marked failed and left out of the loss.
        check_template_drift: count ``rollout/template_drift`` (one template render per trajectory).
        sync_bucket_mb: size of the weight-sync buckets.
        max_failed_fraction: stop the run when more than this fraction of a step's trajectories (over all
            ranks) failed, quoting the most common reasons, instead of training on what is left.
        colocate: the engine shares the trainer's GPU: its memory (weights and KV cache) is released outside
            rollouts and resumed around the weight sync (needs SGLang's ``enable_memory_saver``); see
            ``lit_agentrl.rollout.colocation``. The sync then runs before each rollout, not after each step.
        offload_trainer: in colocated mode, move the trainer's parameters and optimizer state (and the reference's)
            to host memory while the engine generates (default: on when ``colocate`` is; needs ``colocate``).
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
        engine: str = "transformers",
        engine_kwargs: dict[str, Any] | None = None,
        engine_modules: list[str] | None = None,
        n_samples: int = 8,
        sampling_params: dict[str, Any] | None = None,
        val_n_samples: int = 1,
        val_sampling_params: dict[str, Any] | None = None,
        max_inflight_per_engine: int = 256,
        trajectory_timeout_s: float | None = None,
        check_template_drift: bool = True,
        sync_bucket_mb: int = 512,
        max_failed_fraction: float = 0.5,
        colocate: bool = False,
        offload_trainer: bool | None = None,
        flat_reward_warn_steps: int = 5,
        async_rollouts: AsyncRollouts | None = None,
    ) -> None:
        if n_samples < 1 or val_n_samples < 1:
            raise UserInputError(f"n_samples and val_n_samples must be >= 1, got {n_samples} and {val_n_samples}")
        if sync_bucket_mb < 1:
            raise UserInputError(f"sync_bucket_mb must be >= 1, got {sync_bucket_mb}")
        if offload_trainer and not colocate:
            raise UserInputError(
                "RolloutCallback.offload_trainer needs colocate: true (the trainer's states leave the GPU only to make "
                "room for an engine on the same GPU)"
            )
        if async_rollouts is not None and colocate:
            raise UserInputError(
                "RolloutCallback.async_rollouts generates while the trainer trains, so the engine cannot share the "
                "trainer's GPU memory (colocate: true)",
                hint="give the engine GPUs of its own (sglang_http servers), or drop async_rollouts with colocate",
            )
        self.sampling = SamplingParams.from_dict(sampling_params, where="RolloutCallback.sampling_params")
        self.val_sampling = SamplingParams.from_dict(val_sampling_params, where="RolloutCallback.val_sampling_params")
        self.engine_name, self.engine_kwargs = engine, dict(engine_kwargs or {})
        self.engine_modules = list(engine_modules or [])
        self.n_samples, self.val_n_samples = n_samples, val_n_samples
        self.max_inflight_per_engine, self.trajectory_timeout_s = max_inflight_per_engine, trajectory_timeout_s
        self.check_template_drift = check_template_drift
        self.sync_bucket_bytes = sync_bucket_mb << 20
        self.colocate = colocate
        self.offload_trainer = colocate if offload_trainer is None else offload_trainer
        self.async_rollouts = async_rollouts
        self.health = RolloutHealth(max_failed_fraction, flat_reward_warn_steps)
        self.metrics = RolloutMetrics()
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
        module = _grpo_module(pl_module)
        check_module(module, self.val_n_samples)
        tokenizer = load_tokenizer(module.model_path)
        if not tokenizer.chat_template:
            raise UserInputError(
                f"the tokenizer at {module.model_path!r} has no chat template; agents need one to build prompts"
            )
        if self.engine_name in ("sglang", "sglang_http"):  # SGLang without a tokenizer: no stop strings
            for where, params in (("sampling_params", self.sampling), ("val_sampling_params", self.val_sampling)):
                params.check_without_tokenizer(self.engine_name, f"RolloutCallback.{where}")
        collective = TrainerCollective(trainer, module.device)
        seeds = RolloutSeeds(int(os.environ.get("PL_GLOBAL_SEED", 0)), trainer.global_rank)
        import_modules(self.engine_modules, kind="engine")
        engines = build_engines(
            self.engine_name,
            module.model_path,
            seed=seeds.base,
            placement=engine_placement(trainer),
            **self.engine_kwargs,
        )
        offload = (lambda: _offload_states(trainer, module)) if self.offload_trainer else None
        self.fleet = EngineFleet(engines, self.sync_bucket_bytes, collective, self.colocate, offload)
        manager = RolloutManager(
            engines,
            tokenizer,
            processor=load_policy_processor(module.model_path),  # None for a text policy
            max_inflight_per_engine=self.max_inflight_per_engine,
            trajectory_timeout_s=self.trajectory_timeout_s,
            reward_fn=getattr(getattr(trainer, "datamodule", None), "reward_fn", None),  # a user's may have none
            check_template_drift=self.check_template_drift,
        )
        self.loop = RolloutLoop(
            manager, seeds, self.n_samples, self.sampling, self.val_n_samples, self.val_sampling, self.async_rollouts,
            collective,
        )  # fmt: skip
        self.health.collective = collective
        if self.async_rollouts is not None:
            check_async(self.async_rollouts, getattr(trainer, "datamodule", None), module, engines, self.engine_name)
            manager.start_background()  # refuses engines that cannot generate beside the trainer
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
        step = loop.train(batch, trainer.global_step, self._steps_left(trainer), _data(trainer))
        busy_after = fleet.busy_seconds()
        if busy is not None and busy_after is not None and self.async_rollouts is None:  # async: it generated ahead too
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
        if not self.colocate and loop.pushes_after_step:
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
        seconds = fleet.prepare(pl_module.device, _grpo_module(pl_module).policy, loop.version, loop.before_push)
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

    def _steps_left(self, trainer: L.Trainer) -> int:
        """Training steps (rollout batches) left in the run, this one included; a large number without max_steps."""
        if not trainer.max_steps or trainer.max_steps < 0:
            return 1 << 30
        mini_batches = _grpo_module(trainer.lightning_module).optimizer.mini_batches
        return max(0, (trainer.max_steps - trainer.global_step) // mini_batches)


def _offload_states(trainer: L.Trainer, module: GRPOModule) -> list[TrainerOffload]:
    """The trainer's parts a colocated window moves to host memory: the policy with its optimizer, the reference."""
    optimizer = trainer.optimizers[0] if trainer.optimizers else None  # none when only validating
    states = [TrainerOffload(module.policy, optimizer, module.device)]
    if module.reference is not None:
        states.append(TrainerOffload(module.reference, None, module.device))
    return states


def _data(trainer: L.Trainer) -> AgentPromptDataModule | None:
    datamodule = getattr(trainer, "datamodule", None)
    return datamodule if isinstance(datamodule, AgentPromptDataModule) else None


def _grpo_module(pl_module: L.LightningModule) -> GRPOModule:
    if not isinstance(pl_module, GRPOModule):
        raise TypeError(f"RolloutCallback trains a GRPOModule, not a {type(pl_module).__name__}")
    return pl_module
