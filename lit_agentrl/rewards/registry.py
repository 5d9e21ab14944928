"""Name -> reward function registry.

Kept in its own module so reward implementations can import the decorator
without importing the package ``__init__`` (which imports them back).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lit_agentrl.registry import Registry

RewardFn = Callable[..., float]
"""``(completion: str, ground_truth: str | None, **row) -> float``. A reward may carry an attribute
``check_ground_truth(ground_truth) -> str | None`` saying why a ground truth is unusable; rows are checked
with it at setup. The rollout manager calls rewards in its own worker threads, several at once, never on the
event loop: a reward must be thread-safe, and ``signal``-based timeouts (``signal.alarm``) do not work in it."""

REWARDS: Registry[RewardFn] = Registry(
    "reward", on_replace="refuse", unknown="unknown reward {name!r}; registered rewards: {names}"
)

# Substring of a dataset's ``data_source`` that selects a registered reward even when the source is not itself a
# registered name; the seed's rule reward scores GSM8K and the AIME sets with its math reward too.
_DATA_SOURCE_ALIASES: tuple[tuple[str, str], ...] = (
    ("math", "math"),
    ("gsm8k", "math"),
    ("aime", "math"),
    ("geometry3k", "geo3k"),
)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function under ``name``.

    Re-registering the same function is a no-op (e.g. a module imported twice); a different function under a taken
    name raises ``ValueError``.
    """
    return REWARDS.register(name)


def registered_rewards() -> list[str]:
    """Sorted names of all registered reward functions."""
    return REWARDS.names()


def get_reward_fn(name: str) -> RewardFn:
    """Look up a reward by name; ``KeyError`` names the alternatives."""
    return REWARDS.get(name)


def _reward_name_for_source(data_source: str) -> str | None:
    """Registered reward name implied by a dataset's ``data_source``, if any."""
    if data_source in REWARDS:
        return data_source
    lowered = data_source.lower()
    for needle, name in _DATA_SOURCE_ALIASES:
        if needle in lowered and name in REWARDS:
            return name
    return None


def resolve_reward_fn(row: Mapping[str, Any], default: str | None) -> RewardFn | None:
    """Pick the reward for a dataset row.

    The row's ``data_source`` wins when it names (or aliases) a registered
    reward, so mixed datasets score each row correctly; otherwise ``default``
    is used (``KeyError`` if unknown), and ``None`` means "no reward".
    """
    data_source = row.get("data_source")
    if isinstance(data_source, str):
        name = _reward_name_for_source(data_source)
        if name is not None:
            return REWARDS.get(name)
    if default is None:
        return None
    return get_reward_fn(default)
