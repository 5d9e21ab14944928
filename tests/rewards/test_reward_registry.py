"""Tests for the reward registry."""

from __future__ import annotations

import pytest

from lit_agentrl.rewards import (
    get_reward_fn,
    register_reward,
    registered_rewards,
    registry,
    resolve_reward_fn,
)
from lit_agentrl.rewards.math import compute_math_reward


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let tests register rewards without leaking them into other tests."""
    monkeypatch.setattr(registry.REWARDS, "_entries", dict(registry.REWARDS._entries))


def _const_reward(completion: str, ground_truth: str | None, **row: object) -> float:
    return 0.5


def test_math_registered_on_import() -> None:
    assert "math" in registered_rewards()
    assert get_reward_fn("math") is compute_math_reward


def test_register_and_get() -> None:
    assert register_reward("const")(_const_reward) is _const_reward
    assert get_reward_fn("const") is _const_reward
    assert registered_rewards() == sorted(registered_rewards())


def test_reregistering_same_function_is_allowed() -> None:
    register_reward("const")(_const_reward)
    register_reward("const")(_const_reward)
    assert get_reward_fn("const") is _const_reward


def test_duplicate_name_raises() -> None:
    register_reward("const")(_const_reward)
    with pytest.raises(ValueError, match="const"):
        register_reward("const")(lambda completion, ground_truth, **row: 1.0)


def test_unknown_reward_lists_registered_names() -> None:
    register_reward("const")(_const_reward)
    with pytest.raises(KeyError, match=r"unknown reward 'foo'; registered rewards: .*const.*math"):
        get_reward_fn("foo")


@pytest.mark.parametrize(
    "data_source",
    # The seed's rule reward scores GSM8K and the AIME sets with its math reward too.
    [
        "math",
        "DigitalLearningGmbH/MATH-lighteval",
        "math_lighteval",
        "HuggingFaceH4/MATH-500",
        "openai/gsm8k",
        "aime24",
    ],
)
def test_resolve_by_data_source(data_source: str) -> None:
    register_reward("const")(_const_reward)
    assert resolve_reward_fn({"data_source": data_source}, default="const") is compute_math_reward


def test_resolve_exact_data_source_name() -> None:
    register_reward("const")(_const_reward)
    assert resolve_reward_fn({"data_source": "const"}, default="math") is _const_reward


def test_resolve_falls_back_to_default() -> None:
    register_reward("const")(_const_reward)
    assert resolve_reward_fn({"data_source": "my/counting-set"}, default="const") is _const_reward
    assert resolve_reward_fn({"prompt": "hi"}, default="const") is _const_reward
    assert resolve_reward_fn({"data_source": None}, default="const") is _const_reward


def test_resolve_without_match_or_default_is_none() -> None:
    assert resolve_reward_fn({"data_source": "my/counting-set"}, default=None) is None
    assert resolve_reward_fn({}, default=None) is None


def test_resolve_unknown_default_raises() -> None:
    with pytest.raises(KeyError, match="unknown reward 'nope'"):
        resolve_reward_fn({}, default="nope")
