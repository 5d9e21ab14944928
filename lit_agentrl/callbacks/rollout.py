"""RolloutCallback: rollouts before each training step, weight sync after it, validation rollouts."""

from __future__ import annotations

import functools
import gc
import hashlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from transformers import AutoTokenizer

from lit_agentrl.agents.registry import import_modules
from lit_agentrl.callbacks.colocation import ColocatedCycle, PhaseMemory
from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.engines import RolloutEngine, SamplingParams, build_engines
from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.engines.weight_sync import sync_weights
from lit_agentrl.errors import UserInputError
from lit_agentrl.metrics import RolloutMetrics
from lit_agentrl.module import GRPOModule
from lit_agentrl.offload import TrainerOffload
from lit_agentrl.rollout.ahead import RolloutsAhead, batch_key, split_stale
from lit_agentrl.rollout.dynamic import dynamic_rollout
from lit_agentrl.rollout.failure_report import FailureReport, first_tracebacks, reason_of
from lit_agentrl.rollout.flat_rewards import FlatRewardWatch
from lit_agentrl.rollout.manager import RolloutManager, summarize
from lit_agentrl.rollout.tail import Carried, GroupedRollout, take_ready
from lit_agentrl.types import PromptBatch, RolloutBatch, Trajectory

log = logging.getLogger(__name__)


class RolloutCallback(Callback):
    """Drive agent rollouts through rollout engines and keep their weights equal to the policy's.

    Args:
        engine: a registered engine name: ``transformers`` or ``sglang`` (one engine per rank), ``sglang_http``
            (already running SGLang servers shared by all ranks; rank 0 pushes the weights), or your own
            (``@register_engine("name")`` on a :class:`~lit_agentrl.engines.RolloutEngine` subclass).
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
            :mod:`lit_agentrl.callbacks.colocation`. The sync then runs before each rollout, not after each step.
        offload_trainer: in colocated mode, move the trainer's parameters and optimizer state (and the reference's)
            to host memory while the engine generates (default: on when ``colocate`` is; needs ``colocate``).
        flat_reward_warn_steps: warn (naming the likely causes) when every prompt group's rewards have been equal
            for this many steps in a row, as a missing ground truth or the wrong reward function makes them (0: off).
        mode: ``sync`` (default): each step's rollout, then its update, then the weight sync. ``async``: the rollouts
            of the next steps run on the engine while this step trains (:mod:`lit_agentrl.rollout.ahead`).
        max_staleness: in ``async`` mode, how many updates older than the policy a trajectory's weights may be; older
            ones are dropped (``rollout/dropped_stale``). 0 generates nothing ahead: exactly what ``sync`` trains on.
            From 1 on, the model needs ``rollout_correction`` (the off-policy correction).
        partial_rollouts: in ``async`` mode, push the weights as soon as a step ends, into the engine while it
            generates: requests in flight continue on the new weights (their tokens keep the log-probs they were
            sampled with), and up to ``max_staleness`` steps are generated ahead. Without it the push waits until the
            rollouts in flight have finished, so every request runs on one version and at most one step runs ahead.
        ready_fraction: with ``partial_rollouts``, a step trains once this fraction of its prompt groups have finished;
            the unfinished ones keep generating (on the new weights after the step) and are trained with the next step
            (:mod:`lit_agentrl.rollout.tail`), so a long tail does not hold the step. 1.0 (default): every group.
            Below 1, a carried trajectory is one update older when trained, so the rollouts run ``max_staleness - 1``
            steps ahead.

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
        mode: str = "sync",
        max_staleness: int = 1,
        partial_rollouts: bool = False,
        ready_fraction: float = 1.0,
    ) -> None:
        if n_samples < 1 or val_n_samples < 1:
            raise UserInputError(f"n_samples and val_n_samples must be >= 1, got {n_samples} and {val_n_samples}")
        if not 0.0 <= max_failed_fraction <= 1.0:
            raise UserInputError(f"max_failed_fraction must be in [0, 1], got {max_failed_fraction}")
        if sync_bucket_mb < 1:
            raise UserInputError(f"sync_bucket_mb must be >= 1, got {sync_bucket_mb}")
        if offload_trainer and not colocate:
            raise UserInputError(
                "RolloutCallback.offload_trainer needs colocate: true (the trainer's states leave the GPU only to make "
                "room for an engine on the same GPU)"
            )
        _check_mode(mode, max_staleness, partial_rollouts, colocate, ready_fraction)
        self.mode, self.max_staleness, self.partial_rollouts = mode, max_staleness, partial_rollouts
        self.ready_fraction = ready_fraction
        depth = max_staleness if partial_rollouts else min(max_staleness, 1)
        self.ahead = RolloutsAhead(depth - int(ready_fraction < 1)) if mode == "async" else None
        self.carried: Carried | None = None  # groups the last step left running (ready_fraction < 1)
        self.carried_state: dict[str, Any] | None = None  # where they are in the data, on every rank (checkpointed)
        self._rewards_seen = 0.0
        self.trained_steps = 0  # the weight version: updates in the policy's weights (checkpointed)
        self.sampling = SamplingParams.from_dict(sampling_params, where="RolloutCallback.sampling_params")
        SamplingParams.from_dict(val_sampling_params, where="RolloutCallback.val_sampling_params")
        self.engine_name = engine
        self.engine_kwargs = dict(engine_kwargs or {})
        self.engine_modules = list(engine_modules or [])
        self.n_samples, self.val_n_samples = n_samples, val_n_samples
        self.sampling_params = dict(sampling_params or {})
        self.val_sampling_params = dict(val_sampling_params or {})
        self.max_inflight_per_engine = max_inflight_per_engine
        self.trajectory_timeout_s = trajectory_timeout_s
        self.check_template_drift = check_template_drift
        self.sync_bucket_bytes = sync_bucket_mb << 20
        self.colocate = colocate
        self.offload_trainer = colocate if offload_trainer is None else offload_trainer
        self.cycle: ColocatedCycle | None = None
        self.max_failed_fraction = max_failed_fraction
        self.engines: list[RolloutEngine] = []
        self.manager: RolloutManager | None = None
        self.metrics = RolloutMetrics()
        self.flat_rewards = FlatRewardWatch(flat_reward_warn_steps)
        self.failure_report = FailureReport()
        self.totals = {"rollouts": 0, "trajectories": 0, "failed": 0, "syncs": 0}
        self._needs_sync = False
        self._base_seed = 0
        self._carried_to_restore: dict[str, Any] | None = None

    # ------------------------------------------------------------------ lifecycle

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.engines:
            return
        module = _grpo_module(pl_module)
        model_path, temperature = module.model_path, module.objective.temperature
        if abs(self.sampling.temperature - temperature) > 1e-9:
            raise UserInputError(
                f"RolloutCallback.sampling_params.temperature={self.sampling.temperature} but "
                f"model.rollout_temperature={temperature}: log-probs must be computed at the sampling temperature"
            )
        tokenizer = load_tokenizer(model_path)
        if not tokenizer.chat_template:
            raise UserInputError(
                f"the tokenizer at {model_path!r} has no chat template; agents need one to build prompts"
            )
        if self.engine_name in ("sglang", "sglang_http"):  # SGLang without a tokenizer: no stop strings
            for where, params in (
                ("sampling_params", self.sampling_params),
                ("val_sampling_params", self.val_sampling_params),
            ):
                SamplingParams.from_dict(params).check_without_tokenizer(self.engine_name, f"RolloutCallback.{where}")
        self._base_seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        import_modules(self.engine_modules, kind="engine")
        placement = engine_placement(trainer)  # engines on this rank's GPUs place themselves by it
        self.engines = build_engines(
            self.engine_name, model_path, seed=self._base_seed, placement=placement, **self.engine_kwargs
        )
        self.manager = RolloutManager(
            self.engines,
            tokenizer,
            processor=load_vl_processor(model_path),  # None for a text policy
            max_inflight_per_engine=self.max_inflight_per_engine,
            trajectory_timeout_s=self.trajectory_timeout_s,
            reward_fn=getattr(
                getattr(trainer, "datamodule", None), "reward_fn", None
            ),  # a user's data module may have none
            check_template_drift=self.check_template_drift,
        )
        if self.mode == "async":
            self._check_async(trainer, module)
        if self.colocate:  # the trainer loads on a free GPU; the first rollout resumes the engine and pushes weights
            for engine in self._owned:
                engine.release_memory_occupation(tags=["kv_cache", "weights"])
        self.metrics.to(pl_module.device)
        # Everything loaded so far (torch, transformers, LangGraph, the models) lives for the whole run: keep it out
        # of the garbage collector's full passes, which otherwise rescan it during every rollout's agent work
        # (measured: 0.3-0.5 s of a 128-trajectory multi-turn rollout). Unfrozen at teardown, so it can be freed.
        gc.collect()
        gc.freeze()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.ahead is not None:
            self.ahead.cancel()
        if self.carried is not None:  # the last step's tail: the run ends before a step could train it
            self.carried.rollout.cancel()
            self.carried = None
        if self.manager is not None:
            self.manager.close()
        for engine in self.engines:
            engine.shutdown()
        self.engines, self.manager = [], None
        gc.unfreeze()

    # ------------------------------------------------------------------ training

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        memory = PhaseMemory(pl_module.device)
        memory.start()
        self._prepare_engines(trainer, pl_module)
        phases = memory.finish("sync")
        self._reseed(trainer, "train")
        memory.start()
        start, busy = time.perf_counter(), self._engine_busy_seconds()
        rollout, generated, dynamic = self._generate_train(trainer, pl_module, batch)
        seconds = time.perf_counter() - start if self.ahead is None else rollout.stats.seconds
        busy_after = self._engine_busy_seconds()
        if busy is not None and busy_after is not None and self.ahead is None:  # async: it also generated ahead
            pl_module.log("time/generation_s", busy_after - busy, on_step=True, batch_size=1)
        phases.update(memory.finish("rollout"))
        if self.cycle is not None:  # the training step gets the memory back (SGLang needs an idle engine for this)
            phases["memory/offloaded_gb"] = self.cycle.offloaded_gb
            self.cycle.leave()
        memory.start()  # the training step's peak, logged at its end
        metrics = self.metrics.compute(generated, seconds)
        self._count(rollout, len(generated))
        self._report_failures(trainer, generated, metrics)
        self._warn_if_flat(trainer, metrics)
        self._check_failures(metrics, rollout)
        pl_module.log_dict({**metrics, **phases, **dynamic}, on_step=True, batch_size=1)
        pl_module.log(
            "rollout/reward", metrics["rollout/reward_mean"], on_step=True, prog_bar=True, logger=False, batch_size=1
        )
        pl_module.log("time/rollout_s", seconds, on_step=True, prog_bar=True, batch_size=1)
        pl_module.log("time/reward_s", rollout.stats.reward_seconds, on_step=True, batch_size=1)

    def _generate_train(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any
    ) -> tuple[RolloutBatch, list[Trajectory], dict[str, float]]:
        """The step's rollout (attached to ``batch``), every trajectory generated, and dynamic sampling's metrics.

        With ``data.dynamic_sampling`` groups without a gradient are dropped and more prompts drawn (see
        :mod:`lit_agentrl.rollout.dynamic`); ``batch.rows`` then become the rows kept.
        """
        manager, datamodule = self._manager(), getattr(trainer, "datamodule", None)
        if self.ahead is not None:
            return self._take_ahead(trainer, batch)
        if datamodule is None or not getattr(datamodule, "dynamic_sampling", False):
            batch.rollout = manager.generate(
                batch.rows, self.n_samples, self.sampling_params, self._seed(trainer, "train", batch)
            )
            return batch.rollout, batch.rollout.trajectories, {}

        def generate(rows: Any, round_: int) -> RolloutBatch:
            if round_:
                self._reseed(trainer, f"train-extra-{round_}")
            return manager.generate(
                rows, self.n_samples, self.sampling_params, self._seed(trainer, f"extra-{round_}", batch)
            )

        global_sum = functools.partial(_reduce, trainer, pl_module.device, op="sum")
        result = dynamic_rollout(
            batch.rows, generate, datamodule.draw_extra_train_rows, global_sum, datamodule.dynamic_max_rounds
        )
        batch.rows, batch.rollout = list(result.rows), result.rollout
        metrics = {
            "rollout/dynamic_rounds": float(result.rounds),  # the same on every rank
            "rollout/dropped_groups": global_sum(float(result.dropped_groups)),
        }
        return result.rollout, result.generated, metrics

    def _take_ahead(
        self, trainer: L.Trainer, batch: PromptBatch
    ) -> tuple[RolloutBatch, list[Trajectory], dict[str, float]]:
        """Async mode: the batch's rollout (generated ahead, or now), the next ones started, stale trajectories
        dropped."""
        assert self.ahead is not None
        datamodule = cast(AgentPromptDataModule, getattr(trainer, "datamodule", None))  # checked at setup
        manager, loader = self._manager(), datamodule.train_dataloader()

        reduce = functools.partial(_reduce, trainer, _grpo_module(trainer.lightning_module).device)
        grouped = self.ready_fraction < 1

        def submit(coming: PromptBatch) -> Any:
            seed = self._seed(trainer, "train", coming)
            send = manager.submit_groups if grouped else manager.submit
            return send(coming.rows, self.n_samples, self.sampling_params, seed)

        metrics: dict[str, float] = {}
        if grouped:
            rollout, waited, metrics = self._take_ready(trainer, batch, self.ahead.pop(batch, submit), loader, reduce)
        else:
            rollout, waited = self.ahead.take(batch, submit)
        self.ahead.fill(batch, loader.batch_after, submit, limit=self._steps_left(trainer) - 1)
        staleness = split_stale(rollout.trajectories, self.trained_steps, self.max_staleness)
        batch.rollout = RolloutBatch(staleness.kept, rollout.stats)
        values = [float(v) for v in staleness.values]
        count = reduce(float(len(values)), "sum")
        metrics |= {
            "rollout/staleness_mean": reduce(sum(values), "sum") / max(count, 1.0),
            "rollout/staleness_max": reduce(max(values, default=0.0), "max"),
            "rollout/dropped_stale": reduce(float(staleness.dropped), "sum"),
            "rollout/partial_frac": reduce(float(staleness.partial), "sum") / max(count, 1.0),
            "time/wait_rollout_s": waited,
        }
        return batch.rollout, rollout.trajectories, metrics

    def _take_ready(
        self,
        trainer: L.Trainer,
        batch: PromptBatch,
        grouped: GroupedRollout,
        loader: Any,
        reduce: Callable[[float, str], float],
    ) -> tuple[RolloutBatch, float, dict[str, float]]:
        """``ready_fraction`` < 1: the groups the step before left running and this batch's finished ones, the rest
        carried on (``batch.rows`` become the rows trained); the rollout, the wait, and the carry metrics."""
        manager = self._manager()
        self._restore_carried(trainer, loader)
        step = take_ready(batch.rows, grouped, batch_key(batch), self.ready_fraction, self.carried)
        batch.rows, self.carried = step.rows, step.carried
        stats = summarize(step.trajectories, step.seconds)
        stats.reward_seconds, self._rewards_seen = manager.reward_seconds - self._rewards_seen, manager.reward_seconds
        self._note_carried(trainer, batch)
        metrics = {
            "rollout/carried_groups": reduce(float(len(self.carried.groups) if self.carried else 0), "sum"),
            "rollout/carried_in": reduce(float(step.carried_in), "sum"),
        }
        return RolloutBatch(step.trajectories, stats), step.waited, metrics

    def _note_carried(self, trainer: L.Trainer, batch: PromptBatch) -> None:
        """Record which groups of ``batch`` every rank carries on, for the checkpoint (a resumed run regenerates
        them); the same on every rank."""
        mine = list(self.carried.groups) if self.carried is not None else []
        everyone: list[Any] = [mine]
        if dist.is_available() and dist.is_initialized():
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
        carried = any(everyone)
        self.carried_state = {"epoch": batch.epoch, "index": batch.index, "groups": everyone} if carried else None

    def _restore_carried(self, trainer: L.Trainer, loader: Any) -> None:
        """After a resume: regenerate the groups the checkpointed step had left running, for this step to train."""
        state, self._carried_to_restore = self._carried_to_restore, None
        if state is None or self.carried is not None:
            return
        groups = state["groups"]
        if len(groups) != trainer.world_size:
            raise UserInputError(
                f"cannot resume the carried rollout groups: the checkpoint was taken with {len(groups)} processes, "
                f"this run has {trainer.world_size}"
            )
        source = loader.batch_at(state["epoch"], state["index"])
        rows = [source.rows[g] for g in groups[trainer.global_rank]]
        seed = self._seed(trainer, "carried", source)
        rollout = self._manager().submit_groups(rows, self.n_samples, self.sampling_params, seed)
        self.carried = Carried(rollout, rows, list(range(len(rows))), batch_key(source))

    def _steps_left(self, trainer: L.Trainer) -> int:
        """Training steps (rollout batches) left in the run, this one included; a large number without max_steps."""
        if not trainer.max_steps or trainer.max_steps < 0:
            return 1 << 30
        mini_batches = _grpo_module(trainer.lightning_module).update.mini_batches
        return max(0, (trainer.max_steps - trainer.global_step) // mini_batches)

    def _check_async(self, trainer: L.Trainer, module: GRPOModule) -> None:
        """What mode: async needs, checked before the first step."""
        datamodule = getattr(trainer, "datamodule", None)
        if not isinstance(datamodule, AgentPromptDataModule):  # its loader knows the batches to come
            raise UserInputError("RolloutCallback.mode: async needs the data module AgentPromptDataModule (data:)")
        if datamodule.dynamic_sampling:
            raise UserInputError(
                "RolloutCallback.mode: async does not combine with data.dynamic_sampling yet (its extra rounds depend on "
                "the step's rollout)",
                hint="set data.dynamic_sampling: false, or mode: sync",
            )
        if self.max_staleness >= 1 and module.objective.rollout_correction is None:
            raise UserInputError(
                f"RolloutCallback.mode: async with max_staleness={self.max_staleness} trains on trajectories from older "
                "weights: it needs the off-policy correction, model.rollout_correction (with model.old_logprobs: "
                "trainer)",
                hint="set model.old_logprobs: trainer and model.rollout_correction: tis, or max_staleness: 0",
            )
        self._manager().start_background()  # refuses engines that cannot serve it
        if self.partial_rollouts and not all(engine.updates_while_generating for engine in self.engines):
            raise UserInputError(
                f"RolloutCallback.partial_rollouts pushes weights while requests are in flight; engine "
                f"{self.engine_name!r} cannot take them then (the transformers engine and SGLang servers can)",
                hint="partial_rollouts: false (the push then waits for the rollouts in flight)",
            )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        pl_module.log_dict(PhaseMemory(pl_module.device).finish("train"), on_step=True, batch_size=1)
        self.trained_steps += 1
        self._needs_sync = True
        # Colocated: before the next rollout, in the window that gives the engine the GPU. Async without partial
        # rollouts: before the next rollout too, once those in flight have finished on the weights they began with.
        if not self.colocate and not (self.ahead is not None and not self.partial_rollouts):
            self._prepare_engines(trainer, pl_module)

    # ------------------------------------------------------------------ validation

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._prepare_engines(trainer, pl_module)
        self._reseed(trainer, f"val-{batch_idx}")
        seed = self._seed(trainer, f"val-{trainer.global_step}", batch)
        batch.rollout = self._manager().generate(batch.rows, self.val_n_samples, self.val_sampling_params, seed)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.cycle is not None:  # the trainer resident again before checkpoints and training run
            self.cycle.leave()

    @property
    def _shared(self) -> bool:
        return any(engine.shared for engine in self.engines)

    @property
    def _owned(self) -> list[RolloutEngine]:
        """The engines this rank pushes weights into and releases and resumes (all but other ranks' servers)."""
        return [engine for engine in self.engines if engine.owner]

    def _manager(self) -> RolloutManager:
        if self.manager is None:
            raise RuntimeError("RolloutCallback.setup has not run: the callback must be in trainer.callbacks")
        return self.manager

    def _engine_busy_seconds(self) -> float | None:
        """Model compute of the in-process engines so far (None when they do not count it, as SGLang's)."""
        counts = [engine.busy_seconds for engine in self.engines if engine.busy_seconds is not None]
        return sum(counts) if counts else None

    def _seed(self, trainer: L.Trainer, phase: str, batch: PromptBatch) -> int:
        """A rollout's seed, keyed by (run seed, rank, phase, the batch's place in the data): the same whether the
        rollout runs at its step (sync) or ahead of it (async), in an unbroken run or a resumed one."""
        key = f"{self._base_seed}/{trainer.global_rank}/{phase}/{batch.epoch}/{batch.index}"
        return _key_hash(key) >> 1

    def _reseed(self, trainer: L.Trainer, phase: str) -> None:
        """Sampling streams keyed by (seed, rank, step, phase): a resumed run samples what an unbroken one would."""
        key = f"{self._base_seed}/{trainer.global_rank}/{trainer.global_step}/{phase}"
        for index, engine in enumerate(self.engines):  # a no-op for engines that cannot reseed (SGLang)
            engine.reseed(_key_hash(f"{key}/{index}"))

    # ------------------------------------------------------------------ weight sync

    def _prepare_engines(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Bring the engines up to date before they generate: sync the weights if stale, and in colocated mode open
        a generation window (the engine's memory back, the trainer's states out; a no-op while one is open)."""
        cycle = self._colocation(trainer, pl_module)
        if cycle is not None and not cycle.open:
            self._needs_sync |= cycle.released  # SGLang dropped its weights with its memory
            cycle.enter(functools.partial(self._sync_if_needed, trainer, pl_module))
        else:
            self._sync_if_needed(trainer, pl_module)

    def _colocation(self, trainer: L.Trainer, pl_module: L.LightningModule) -> ColocatedCycle | None:
        """Colocated mode's cycle, built on first use (the model and optimizer exist only after setup)."""
        if not self.colocate:
            return None
        if self.cycle is None:
            module, states = _grpo_module(pl_module), []
            if self.offload_trainer:
                optimizer = trainer.optimizers[0] if trainer.optimizers else None  # none when only validating
                states.append(TrainerOffload(module.policy, optimizer, module.device))
                if module.reference is not None:
                    states.append(TrainerOffload(module.reference, None, module.device))
            barrier = functools.partial(trainer.strategy.barrier, "colocated_engine_memory") if self._shared else None
            self.cycle = ColocatedCycle(self._owned, module.device, states, released=True, barrier=barrier)
        return self.cycle

    def _sync_if_needed(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._needs_sync:
            self._sync(trainer, pl_module)

    def _sync(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.ahead is not None and not self.partial_rollouts:  # every request in flight ends on its weights
            self.ahead.wait_all()
        start = time.perf_counter()
        policy = _grpo_module(pl_module).policy
        sync_weights(policy, self._owned, self.sync_bucket_bytes, self.trained_steps)  # every rank gathers
        if self._shared:  # no rank may generate from a shared engine before its owner has updated it
            trainer.strategy.barrier("rollout_weight_sync")
        self.totals["syncs"] += 1
        self._needs_sync = False
        if trainer.training:
            pl_module.log("time/sync_s", time.perf_counter() - start, on_step=True, batch_size=1)

    def _report_failures(self, trainer: L.Trainer, trajectories: list[Trajectory], metrics: dict[str, float]) -> None:
        """Every step with failed trajectories, on rank 0: their counts by reason over all ranks, and the first
        traceback of each reason not seen before, in full (it ends with the line in the agent's file)."""
        if not metrics["rollout/failed"]:  # a global count: every rank skips the gather together
            return
        failed = [t for t in trajectories if t.failed]
        local = (Counter(map(reason_of, failed)), first_tracebacks(failed))
        parts: list[Any] = [local]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, local)
        if not trainer.is_global_zero:
            return
        reasons: Counter[str] = sum((counts for counts, _ in parts), Counter())
        tracebacks: dict[str, str] = {}
        for _, rank_tracebacks in parts:  # each reason's traceback from the lowest rank that saw it
            for reason, traceback in rank_tracebacks.items():
                tracebacks.setdefault(reason, traceback)
        failures, total = int(metrics["rollout/failed"]), int(metrics["rollout/trajectories"])
        log.warning("%s", self.failure_report.message(trainer.global_step, failures, total, reasons, tracebacks))

    def _warn_if_flat(self, trainer: L.Trainer, metrics: dict[str, float]) -> None:
        """Warn, on rank 0, when the rewards have carried no signal for ``flat_reward_warn_steps`` steps."""
        warning = self.flat_rewards.update(
            metrics["rollout/flat_group_frac"], metrics["rollout/reward_min"], metrics["rollout/reward_max"]
        )
        if warning and trainer.is_global_zero:
            log.warning("step %d: %s", trainer.global_step, warning)

    def _check_failures(self, metrics: dict[str, float], rollout: RolloutBatch) -> None:
        """Stop when too many trajectories failed; every rank sees the same global counts, so all stop."""
        total = metrics["rollout/trajectories"]
        if total and metrics["rollout/failed"] / total > self.max_failed_fraction:
            reasons = "; ".join(f"{n} x {reason}" for reason, n in rollout.stats.failure_reasons.most_common(3))
            raise RuntimeError(
                f"{metrics['rollout/failed']:.0f} of {total:.0f} trajectories failed this step, more than "
                f"max_failed_fraction={self.max_failed_fraction}; most common reasons on this rank: {reasons}"
            )

    def _count(self, rollout: RolloutBatch, generated: int) -> None:
        self.totals["rollouts"] += 1
        self.totals["trajectories"] += generated
        self.totals["failed"] += rollout.stats.num_failed

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "trained_steps": self.trained_steps, "carried": self.carried_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.totals.update(state_dict.get("totals", {}))
        self.trained_steps = int(state_dict.get("trained_steps", 0))
        self._carried_to_restore = state_dict.get("carried")
        if self._carried_to_restore is not None and self.ready_fraction == 1.0:
            groups = sum(len(g) for g in self._carried_to_restore["groups"])
            rank_zero_warn(
                f"RolloutCallback: the checkpoint's step left {groups} prompt group(s) running for the next step "
                "(ready_fraction < 1); this run has ready_fraction: 1.0 and will not train them"
            )
        self._needs_sync = True  # the engines still hold the initial weights; the restored policy differs
        rank_zero_info(
            "RolloutCallback: the engines will be re-synced with the restored policy before the first rollout"
        )


def engine_placement(trainer: L.Trainer) -> EnginePlacement:
    """This rank's place for its engines: Lightning's ranks, and the ranks per node (``LOCAL_WORLD_SIZE`` where the
    launcher sets it, as torchrun does; else the trainer's devices per node).
    """
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE") or trainer.num_devices)
    return EnginePlacement(trainer.global_rank, trainer.local_rank, local_world_size, trainer.world_size)


def load_tokenizer(model_path: str) -> Any:
    """The policy's tokenizer from ``model_path``, with an error naming the path when there is none."""
    try:
        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as exc:
        raise UserInputError(f"model.model_path={model_path!r}: no loadable tokenizer there ({exc})") from exc


def load_vl_processor(model_path: str) -> Any:
    """A vision-language policy's processor (None for a text policy), with an error naming the path."""
    from lit_agentrl.processors import load_processor

    try:
        return load_processor(model_path)
    except (OSError, ValueError) as exc:
        raise UserInputError(f"model.model_path={model_path!r}: no loadable image processor there ({exc})") from exc


def _grpo_module(pl_module: L.LightningModule) -> GRPOModule:
    if not isinstance(pl_module, GRPOModule):
        raise TypeError(f"RolloutCallback trains a GRPOModule, not a {type(pl_module).__name__}")
    return pl_module


def _key_hash(key: str) -> int:
    """A 64-bit seed from a text key, the same in every process and run."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def _reduce(trainer: L.Trainer, device: torch.device, value: float, op: str) -> float:
    """``value`` summed or maximised over all ranks."""
    return float(trainer.strategy.reduce(torch.tensor(value, device=device), reduce_op=op))


def _check_mode(mode: str, max_staleness: int, partial_rollouts: bool, colocate: bool, ready_fraction: float) -> None:
    if mode not in ("sync", "async"):
        raise UserInputError(f"RolloutCallback.mode must be 'sync' or 'async', got {mode!r}")
    if not 0.0 < ready_fraction <= 1.0:
        raise UserInputError(f"RolloutCallback.ready_fraction must be in (0, 1], got {ready_fraction}")
    if ready_fraction < 1.0 and not (mode == "async" and partial_rollouts and max_staleness >= 1):
        raise UserInputError(
            f"RolloutCallback.ready_fraction={ready_fraction} carries a step's unfinished groups into the next step, "
            "on newer weights: it needs mode: async, partial_rollouts: true and max_staleness >= 1",
            hint="set those, or ready_fraction: 1.0",
        )
    if max_staleness < 0:
        raise UserInputError(f"RolloutCallback.max_staleness must be >= 0, got {max_staleness}")
    if partial_rollouts and mode != "async":
        raise UserInputError(
            "RolloutCallback.partial_rollouts needs mode: async (sync rollouts never overlap an update)"
        )
    if mode == "async" and colocate:
        raise UserInputError(
            "RolloutCallback.mode: async generates while the trainer trains, so the engine cannot share the trainer's "
            "GPU memory (colocate: true)",
            hint="give the engine GPUs of its own (sglang_http servers), or use mode: sync with colocate",
        )
