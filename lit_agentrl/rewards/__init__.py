"""Reward functions for verifiable tasks, looked up by name."""

from lit_agentrl.rewards.registry import (
    RewardFn,
    get_reward_fn,
    register_reward,
    registered_rewards,
    resolve_reward_fn,
)

# Imported for its side effect: registers the "math" reward.
from lit_agentrl.rewards import math as _math  # noqa: F401

__all__ = [
    "RewardFn",
    "get_reward_fn",
    "register_reward",
    "registered_rewards",
    "resolve_reward_fn",
]
