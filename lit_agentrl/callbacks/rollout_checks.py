"""What ``RolloutCallback``'s settings need of the data, the module and the engines: checked at setup, before the
first step, each refusal naming the keys to change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_agentrl.config.rollout import AsyncRollouts, Rewards
from lit_agentrl.config.training import Correction
from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.engines import RolloutEngine
from lit_agentrl.errors import UserInputError
from lit_agentrl.rewards import get_reward_fn


def check_reward(reward: Rewards, datamodule: Any) -> None:
    """The default reward is registered (users' functions are, once ``data.agent_modules`` were imported at the data's
    setup), and every row it would score carries a ground truth."""
    key = "RolloutCallback.reward.fn"
    if reward.fn is not None:
        try:
            get_reward_fn(reward.fn)
        except KeyError as exc:
            raise UserInputError(f"{key}: {exc.args[0]}") from None
    if isinstance(datamodule, AgentPromptDataModule):
        datamodule.check_ground_truths(reward.fn, key)


def check_async(
    schedule: AsyncRollouts,
    datamodule: Any,
    correction: Correction | None,
    engines: Sequence[RolloutEngine],
    engine_name: str,
) -> None:
    """What ``async_rollouts`` needs: the data module that knows the batches to come, the off-policy correction for
    stale trajectories, and engines that take weights mid-generation for ``partial``."""
    if not isinstance(datamodule, AgentPromptDataModule):
        raise UserInputError("RolloutCallback.async_rollouts needs the data module AgentPromptDataModule (data:)")
    if schedule.staleness >= 1 and correction is None:
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
