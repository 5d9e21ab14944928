"""Reward functions for verifiable tasks, looked up by name."""

# Imported for their side effect: they register the "math", "next_digit" and "geo3k" rewards.
from lit_agentrl.rewards import digits as _digits  # noqa: F401
from lit_agentrl.rewards import geo3k as _geo3k  # noqa: F401
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
