"""The Geometry3K reward: the seed's ``acc_reward``/``format_reward``/``compute_score`` and the registered ``geo3k``."""

from __future__ import annotations

import pytest

from lit_agentrl.rewards import get_reward_fn, resolve_reward_fn
from lit_agentrl.rewards.geo3k import DATA_SOURCE, acc_reward, compute_score, format_reward, geo3k_reward


@pytest.mark.parametrize(
    ("predict", "truth", "expected"),
    [
        ("so the side is \\boxed{3\\sqrt{3}}", "3\\sqrt{3}", 1.0),
        ("\\boxed{\\sqrt{27}}", "3\\sqrt{3}", 1.0),  # equivalent, not equal text
        ("first \\boxed{2} then \\boxed{60}", "60", 1.0),  # the last box is the answer
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{61}", "60", 0.0),
        ("the answer is 60", "60", 0.0),  # no box
        ("\\boxed{60", "60", 0.0),  # a truncated box is no answer
    ],
)
def test_acc_reward_with_boxed(predict: str, truth: str, expected: float) -> None:
    assert acc_reward(predict, truth) == expected
    assert acc_reward(predict, truth, use_boxed=True) == expected


@pytest.mark.parametrize(
    ("answer", "truth", "expected"),
    [
        ("60", "60", 1.0),
        (" 3\\sqrt{3} ", "3\\sqrt{3}", 1.0),
        ("\\frac{5}{2}", "2.5", 1.0),
        ("59", "60", 0.0),
        ("", "60", 0.0),
    ],
)
def test_acc_reward_without_boxed_compares_the_whole_text(answer: str, truth: str, expected: float) -> None:
    assert acc_reward(answer, truth, use_boxed=False) == expected


def test_format_reward_wants_thinking_then_a_box() -> None:
    assert format_reward("<think>angles add up</think> so \\boxed{60}") == 1.0
    assert format_reward("\\boxed{60}") == 0.0
    assert format_reward("<think>no answer</think>") == 0.0


def test_compute_score_mixes_accuracy_and_format() -> None:
    assert compute_score("<think>t</think>\\boxed{60}", "60") == pytest.approx(1.0)
    assert compute_score("\\boxed{60}", "60") == pytest.approx(0.9)
    assert compute_score("<think>t</think>\\boxed{1}", "60", format_score=0.2) == pytest.approx(0.2)


def test_registered_for_the_geometry3k_data_source() -> None:
    assert get_reward_fn("geo3k") is geo3k_reward
    assert resolve_reward_fn({"data_source": DATA_SOURCE}, "math") is geo3k_reward
    assert geo3k_reward("x = \\boxed{60}", "60", data_source=DATA_SOURCE) == pytest.approx(0.9)
    assert geo3k_reward("<think>area</think> so \\boxed{60}", "60") == pytest.approx(1.0)
    assert geo3k_reward("<think>area</think> so \\boxed{61}", "60") == pytest.approx(0.1)
    assert geo3k_reward("x = 60", "60") == 0.0


def test_ground_truth_check() -> None:
    check = geo3k_reward.check_ground_truth  # type: ignore[attr-defined]
    assert check("3\\sqrt{3}") is None
    assert check("") and check(None) and check("1" * 2000)
