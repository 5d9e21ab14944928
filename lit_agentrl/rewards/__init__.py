"""Reward functions for verifiable tasks, looked up by name."""

# Imported for their side effect: they register the "math" and "next_digit" rewards.
from lit_agentrl.rewards import digits as _digits  # noqa: F401
from lit_agentrl.rewards import math as _math  # noqa: F401
from lit_agentrl.rewards.registry import (
    RewardFn,
    get_reward_fn,
    register_reward,
    registered_rewards,
    resolve_reward_fn,
)

__all__ = [
    "RewardFn",
    "get_reward_fn",
    "register_reward",
    "registered_rewards",
    "resolve_reward_fn",
]
