"""How ``RolloutCallback`` builds its rollout side from the trainer at setup, and what it reads from the trainer
during the run: the settings checked together, then the engines, their fleet, the manager and the loop."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import lightning as L

from lit_agentrl.bridge.offload import TrainerOffload
from lit_agentrl.callbacks.ranks import TrainerCollective, engine_placement
from lit_agentrl.callbacks.rollout_checks import check_async, check_module
from lit_agentrl.config.rollout import EngineSettings
from lit_agentrl.config.training import Lora
from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.engines import SamplingParams, build_engines, get_engine_class
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.processors import load_policy_processor, load_tokenizer
from lit_agentrl.registry import import_modules
from lit_agentrl.rollout.fleet import EngineFleet, check_serves_adapters
from lit_agentrl.rollout.loop import RolloutLoop
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rollout.schedule import AsyncRollouts
from lit_agentrl.rollout.seeds import RolloutSeeds
from lit_agentrl.training.module import GRPOModule


@dataclass(frozen=True)
class RolloutSettings:
    """``RolloutCallback``'s arguments, typed and checked against each other (see the callback for each)."""

    engine: EngineSettings
    n_samples: int
    sampling: SamplingParams
    val_n_samples: int
    val_sampling: SamplingParams
    trajectory_timeout_s: float | None
    check_template_drift: bool
    async_rollouts: AsyncRollouts | None

    def __post_init__(self) -> None:
        if self.n_samples < 1 or self.val_n_samples < 1:
            raise UserInputError(
                f"n_samples and val_n_samples must be >= 1, got {self.n_samples} and {self.val_n_samples}"
            )
        if self.async_rollouts is not None and self.engine.colocate:
            raise UserInputError(
                "RolloutCallback.async_rollouts generates while the trainer trains, so the engine cannot share the "
                "trainer's GPU memory (colocate: true)",
                hint="give the engine GPUs of its own (sglang_http servers), or drop async_rollouts with colocate",
            )
        self.sampling.check_for_rollouts("RolloutCallback.sampling_params", "n_samples", training=True)
        self.val_sampling.check_for_rollouts("RolloutCallback.val_sampling_params", "val_n_samples", training=False)
        if self.engine.name in ("sglang", "sglang_http"):  # SGLang without a tokenizer: no stop strings
            for where, params in (("sampling_params", self.sampling), ("val_sampling_params", self.val_sampling)):
                params.check_without_tokenizer(self.engine.name, f"RolloutCallback.{where}")


def build_rollout(settings: RolloutSettings, trainer: L.Trainer, module: GRPOModule) -> tuple[RolloutLoop, EngineFleet]:
    """This rank's engines in their fleet, and the loop that drives agents through them (refusing, before any engine
    starts, what the module, tokenizer or data cannot do with these settings)."""
    check_module(module, settings.val_n_samples)
    tokenizer = load_tokenizer(module.model_path)
    if not tokenizer.chat_template:
        raise UserInputError(
            f"the tokenizer at {module.model_path!r} has no chat template; agents need one to build prompts"
        )
    collective = TrainerCollective(trainer, module.device)
    seeds = RolloutSeeds(int(os.environ.get("PL_GLOBAL_SEED", 0)), trainer.global_rank)
    engine = settings.engine
    import_modules(engine.modules, kind="engine")
    engine_kwargs = dict(engine.kwargs)
    if module.lora.syncs_adapter:  # before any engine starts
        engine_kwargs = adapter_serving_kwargs(engine, module.lora)
    engines = build_engines(engine.name, module.model_path, seeds.base, engine_placement(trainer), **engine_kwargs)
    offload = (lambda: _offload_states(trainer, module)) if engine.offloads else None
    lora = module.lora if module.lora.enabled else None
    fleet = EngineFleet(engines, engine.sync_bucket_mb << 20, collective, engine.colocate, offload, lora)
    manager = RolloutManager(
        engines,
        tokenizer,
        processor=load_policy_processor(module.model_path),  # None for a text policy
        max_inflight_per_engine=engine.max_inflight,
        trajectory_timeout_s=settings.trajectory_timeout_s,
        reward_fn=getattr(getattr(trainer, "datamodule", None), "reward_fn", None),  # a user's may have none
        check_template_drift=settings.check_template_drift,
    )
    loop = RolloutLoop(
        manager, seeds, settings.n_samples, settings.sampling, settings.val_n_samples, settings.val_sampling,
        settings.async_rollouts, collective,
    )  # fmt: skip
    if settings.async_rollouts is not None:
        check_async(settings.async_rollouts, getattr(trainer, "datamodule", None), module, engines, engine.name)
        manager.start_background()  # refuses engines that cannot generate beside the trainer
    return loop, fleet


def adapter_serving_kwargs(engine: EngineSettings, lora: Lora) -> dict[str, Any]:
    """``engine.kwargs`` with what the engine needs to serve the policy's adapters (``model.lora.sync: adapter``),
    refusing engines that cannot."""
    engine_class = get_engine_class(engine.name)
    check_serves_adapters([engine_class])
    if engine.colocate and engine_class.release_drops_weights:
        raise UserInputError(
            f"model.lora.sync: adapter with RolloutCallback.engine.colocate: engine {engine.name!r} frees its base "
            "weights in every colocated window, and an adapter push does not bring them back",
            hint="set model.lora.sync: merged (the merged weights are pushed into each window), or colocate: false",
        )
    return {**engine_class.lora_engine_kwargs(lora, engine.kwargs), **engine.kwargs}


def steps_left(trainer: L.Trainer) -> int:
    """Training steps (rollout batches) left in the run, this one included; a large number without max_steps."""
    if not trainer.max_steps or trainer.max_steps < 0:
        return 1 << 30
    mini_batches = grpo_module(trainer.lightning_module).optimizer.mini_batches
    return max(0, (trainer.max_steps - trainer.global_step) // mini_batches)


def prompt_data(trainer: L.Trainer) -> AgentPromptDataModule | None:
    """The trainer's data module when it is the project's (which knows the batches to come), else None."""
    datamodule = getattr(trainer, "datamodule", None)
    return datamodule if isinstance(datamodule, AgentPromptDataModule) else None


def grpo_module(pl_module: Any) -> GRPOModule:
    if not isinstance(pl_module, GRPOModule):
        raise TypeError(f"RolloutCallback trains a GRPOModule, not a {type(pl_module).__name__}")
    return pl_module


def _offload_states(trainer: L.Trainer, module: GRPOModule) -> list[TrainerOffload]:
    """The trainer's parts a colocated window moves to host memory: the policy with its optimizer, the reference."""
    optimizer = trainer.optimizers[0] if trainer.optimizers else None  # none when only validating
    states = [TrainerOffload(module.policy, optimizer, module.device)]
    if module.reference is not None:
        states.append(TrainerOffload(module.reference, None, module.device))
    return states
