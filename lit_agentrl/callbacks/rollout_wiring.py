"""How ``RolloutCallback`` builds its rollout side at setup, and what it reads from the trainer during the run.

The callback depends on :class:`RolloutPolicy`, what the rollout side reads of the LightningModule (``GRPOModule``
has it), not on the module's class.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, cast

import lightning as L
import torch

from lit_agentrl.bridge.offload import TrainerOffload
from lit_agentrl.callbacks.ranks import TrainerCollective, engine_placement
from lit_agentrl.callbacks.rollout_checks import check_async, check_reward
from lit_agentrl.config.rollout import EngineSettings, RolloutSettings
from lit_agentrl.config.training import Correction, Lora, Optimizer
from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.engines import build_engines, get_engine_class
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.processors import load_policy_processor, load_tokenizer
from lit_agentrl.registry import import_modules
from lit_agentrl.rollout.fleet import EngineFleet, check_serves_adapters
from lit_agentrl.rollout.health import RolloutHealth
from lit_agentrl.rollout.judge import LLMJudge
from lit_agentrl.rollout.loop import RolloutLoop
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rollout.metrics import RolloutMetrics
from lit_agentrl.rollout.seeds import RolloutSeeds
from lit_agentrl.rollout.step import RolloutStep


class RolloutPolicy(Protocol):
    """What the rollout side reads of the LightningModule: where the policy came from, the weights the engines must
    hold, and the settings the rollout depends on."""

    model_path: str
    """The policy's folder (tokenizer, chat template, processor; the engines' initial weights)."""
    lora: Lora
    """Its adapters: whether the engines get merged weights or the adapters alone."""
    correction: Correction | None
    """The off-policy correction (stale trajectories of asynchronous rollouts need one)."""
    optimizer: Optimizer
    """Its updates per rollout batch (``mini_batches``): how many rollout batches the run has left."""

    @property
    def policy(self) -> torch.nn.Module: ...

    @property
    def reference(self) -> torch.nn.Module | None: ...


_POLICY_MEMBERS = ("model_path", "lora", "correction", "optimizer", "policy", "reference")


def rollout_policy(pl_module: Any) -> RolloutPolicy:
    """``pl_module`` as the rollout side reads it, refused naming what it lacks (``dir`` lists the members without
    calling a property such as ``policy``, which raises before ``configure_model``)."""
    missing = [name for name in _POLICY_MEMBERS if name not in dir(pl_module)]
    if missing:
        raise TypeError(
            f"RolloutCallback trains a LightningModule with {', '.join(_POLICY_MEMBERS)} (as "
            f"lit_agentrl.training.GRPOModule has); {type(pl_module).__name__} lacks {', '.join(missing)}"
        )
    return cast("RolloutPolicy", pl_module)


def build_rollout(
    settings: RolloutSettings,
    trainer: L.Trainer,
    module: RolloutPolicy,
    device: torch.device,
    health: RolloutHealth,
    metrics: RolloutMetrics,
) -> RolloutStep:
    """This rank's engines in their fleet, the loop that drives agents through them, and the step over both
    (refusing, before any engine starts, what the module, tokenizer or data cannot do with these settings)."""
    datamodule = getattr(trainer, "datamodule", None)
    check_reward(settings.reward, datamodule)
    tokenizer = load_tokenizer(module.model_path)
    if not tokenizer.chat_template:
        raise UserInputError(
            f"the tokenizer at {module.model_path!r} has no chat template; agents need one to build prompts"
        )
    collective = TrainerCollective(trainer, device)
    health.collective = collective
    seeds = RolloutSeeds(int(os.environ.get("PL_GLOBAL_SEED", 0)), trainer.global_rank)
    engine = settings.engine
    import_modules(engine.modules, kind="engine")
    engine_kwargs = dict(engine.kwargs)
    if module.lora.syncs_adapter:  # before any engine starts
        engine_kwargs = adapter_serving_kwargs(engine, module.lora)
    engines = build_engines(engine.name, module.model_path, seeds.base, engine_placement(trainer), **engine_kwargs)
    offload = (lambda: _offload_states(trainer, module, device)) if engine.offloads else None
    lora = module.lora if module.lora.enabled else None
    fleet = EngineFleet(engines, engine.sync_bucket_mb << 20, collective, engine.colocate, offload, lora)
    manager = RolloutManager(
        engines,
        tokenizer,
        processor=load_policy_processor(module.model_path),  # None for a text policy
        max_inflight_per_engine=engine.max_inflight,
        trajectory_timeout_s=settings.health.trajectory_timeout_s,
        reward_fn=settings.reward.fn,
        check_template_drift=settings.health.template_drift,
        judge=LLMJudge(settings.reward.judge, seeds.base) if settings.reward.judge is not None else None,
    )
    loop = RolloutLoop(manager, seeds, settings.train, settings.validation, settings.async_rollouts, collective)
    if settings.async_rollouts is not None:
        check_async(settings.async_rollouts, datamodule, module.correction, engines, engine.name)
        manager.start_background()  # refuses engines that cannot generate beside the trainer
    return RolloutStep(loop, fleet, health, metrics, engine.colocate)


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
    mini_batches = rollout_policy(trainer.lightning_module).optimizer.mini_batches
    return max(0, (trainer.max_steps - trainer.global_step) // mini_batches)


def prompt_data(trainer: L.Trainer) -> AgentPromptDataModule | None:
    """The trainer's data module when it is the project's (which knows the batches to come), else None."""
    datamodule = getattr(trainer, "datamodule", None)
    return datamodule if isinstance(datamodule, AgentPromptDataModule) else None


def _offload_states(trainer: L.Trainer, module: RolloutPolicy, device: torch.device) -> list[TrainerOffload]:
    """The trainer's parts a colocated window moves to host memory: the policy with its optimizer, the reference."""
    optimizer = trainer.optimizers[0] if trainer.optimizers else None  # none when only validating
    states = [TrainerOffload(module.policy, optimizer, device)]
    if module.reference is not None:
        states.append(TrainerOffload(module.reference, None, device))
    return states
