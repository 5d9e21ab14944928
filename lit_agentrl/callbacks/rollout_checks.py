"""What ``RolloutCallback``'s settings need of the module, the data and the engines: checked at setup, before the
first step, each refusal naming the keys to change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.engines import RolloutEngine
from lit_agentrl.errors import UserInputError
from lit_agentrl.rollout.schedule import AsyncRollouts
from lit_agentrl.training.module import GRPOModule


def check_module(module: GRPOModule, val_n_samples: int) -> None:
    """The module's pass@k needs no more samples than validation draws."""
    if max(module.val_pass_k) > val_n_samples:
        raise UserInputError(
            f"model.val_pass_k={module.val_pass_k} needs k <= RolloutCallback.val_n_samples={val_n_samples} "
            "(the samples per validation prompt)",
            hint=f"set val_n_samples >= {max(module.val_pass_k)} or drop the larger k from model.val_pass_k",
        )


def check_async(
    schedule: AsyncRollouts, datamodule: Any, module: GRPOModule, engines: Sequence[RolloutEngine], engine_name: str
) -> None:
    """What ``async_rollouts`` needs: the data module that knows the batches to come, no dynamic sampling, the
    off-policy correction for stale trajectories, and engines that take weights mid-generation for ``partial``."""
    if not isinstance(datamodule, AgentPromptDataModule):
        raise UserInputError("RolloutCallback.async_rollouts needs the data module AgentPromptDataModule (data:)")
    if datamodule.dynamic_sampling:
        raise UserInputError(
            "RolloutCallback.async_rollouts does not combine with data.dynamic_sampling yet (its extra rounds "
            "depend on the step's rollout)",
            hint="set data.dynamic_sampling: false, or drop async_rollouts",
        )
    if schedule.staleness >= 1 and module.correction is None:
        raise UserInputError(
            f"RolloutCallback.async_rollouts trains on trajectories up to {schedule.staleness} update(s) older than "
            "the policy: it needs the off-policy correction, model.correction (with model.loss.old_logprobs: "
            "trainer)",
            hint="set model.loss.old_logprobs: trainer and model.correction: {kind: tis}, or async_rollouts: {ahead: 0}",
        )
    if schedule.partial and not all(engine.updates_while_generating for engine in engines):
        raise UserInputError(
            f"RolloutCallback.async_rollouts.partial pushes weights while requests are in flight; engine "
            f"{engine_name!r} cannot take them then (the transformers engine and SGLang servers can)",
            hint="async_rollouts.partial: false (the push then waits for the rollouts in flight)",
        )
