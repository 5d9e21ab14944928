"""Tests for MATH answer extraction, equivalence and reward."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from lit_agentrl.rewards import math as math_reward
from lit_agentrl.rewards.math import (
    MAX_ANSWER_CHARS,
    compute_math_reward,
    extract_boxed_answer,
    is_equiv,
    last_boxed_only_string,
)


@pytest.mark.parametrize(
    ("text", "box", "answer"),
    [
        (r"so \boxed{\frac{1}{2}}.", r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{1} then \boxed{2}", r"\boxed{2}", "2"),
        (r"\boxed{1} then \fbox{2}", r"\fbox{2}", "2"),
        (r"\fbox{1} then \boxed{a_{n}}", r"\boxed{a_{n}}", "a_{n}"),
        (r"\boxed{\boxed{3}}", r"\boxed{3}", "3"),
        (r"$\boxed 5$", r"\boxed 5", "5"),
        (r"The answer is \boxed 12.", r"\boxed 12", "12"),
        (r"\boxed {7}", r"\boxed {7}", "7"),
        (r"\boxed{\{1, 2\}}", r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    ],
)
def test_boxed_extraction(text: str, box: str, answer: str) -> None:
    assert last_boxed_only_string(text) == box
    assert extract_boxed_answer(text) == answer


@pytest.mark.parametrize(
    "text",
    ["no box here", r"\boxed{\frac{1}{2}", r"\boxed{1} and \boxed{2", r"\boxedx", r"\boxed  "],
)
def test_boxed_extraction_none(text: str) -> None:
    assert last_boxed_only_string(text) is None
    assert extract_boxed_answer(text) is None


EQUIVALENT = [
    (r"\frac{1}{2}", "0.5"),
    ("0.5", r"\frac{1}{2}"),
    ("1/2", r"\frac{1}{2}"),
    (r"\dfrac{1}{2}", "0.5"),
    (r"\frac12", "1/2"),
    ("0.25", r"\frac{1}{4}"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    ("3.0", "3"),
    (r"\boxed{3}", "3"),
    (r"$\frac12$", "0.5"),
    ("-2", "-2.0"),
    (r"-\frac{1}{2}", "-0.5"),
    ("x=3", "3"),
    ("(1,2]", "(1, 2]"),
    (r"[0,\infty)", r"[0, \infty)"),
    ("(x+1)^2", "x^2+2x+1"),
    (r"\text{some words}", r"\text{some   words}"),
]

NOT_EQUIVALENT = [
    ("5", "6"),
    (r"-\frac{1}{2}", r"\frac{1}{2}"),
    ("0.33", r"\frac{1}{3}"),
    (r"\sqrt{3}", r"\sqrt{2}"),
    ("(1,2)", "[1,2]"),
    ("x=4", "3"),
    ("asdf}{", "3"),
    (r"\frac{", "1"),
    ("", ""),
    ("3", ""),
]


@pytest.mark.parametrize(("pred", "truth"), EQUIVALENT)
def test_is_equiv_true(pred: str, truth: str) -> None:
    assert is_equiv(pred, truth)


@pytest.mark.parametrize(("pred", "truth"), NOT_EQUIVALENT)
def test_is_equiv_false(pred: str, truth: str) -> None:
    assert not is_equiv(pred, truth)


def test_is_equiv_rejects_overlong_inputs() -> None:
    long_pred = "1+" * MAX_ANSWER_CHARS + "1"
    assert not is_equiv(long_pred, str(MAX_ANSWER_CHARS + 1))


def test_is_equiv_never_raises_on_bad_types() -> None:
    assert not is_equiv(None, "3")  # type: ignore[arg-type]


def test_is_equiv_from_worker_threads() -> None:
    pairs = [(r"\frac{1}{2}", "0.5"), (r"\sqrt{8}", r"2\sqrt{2}"), ("5", "6"), ("x=3", "3")]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda pair: is_equiv(*pair), pairs))
    assert results == [True, True, False, True]


def _spy_parse_timeouts(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    seen: list[object] = []
    real_parse = math_reward.parse

    def spy(*args: object, **kwargs: object) -> list[object]:
        seen.append(kwargs["parsing_timeout"])
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(math_reward, "parse", spy)
    return seen


def test_timeout_kept_on_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy_parse_timeouts(monkeypatch)
    assert is_equiv(r"\frac{1}{2}", "0.5")
    assert seen and set(seen) == {math_reward.MAIN_THREAD_TIMEOUT_S}


def test_off_main_thread_parsed_in_a_worker_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off the main thread the alarm cannot work here: the check runs in a worker process (see
    test_math_reward_isolation.py), which parses with the alarm on its own main thread."""
    seen = _spy_parse_timeouts(monkeypatch)
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(is_equiv(r"\frac{1}{2}", "0.5")))
    worker.start()
    worker.join()
    assert results == [True]
    assert seen == []  # nothing parsed in this process


@pytest.mark.parametrize(
    ("completion", "truth", "reward"),
    [
        (r"Thus $x = \boxed{\dfrac{1}{2}}$.", "0.5", 1.0),
        (r"First \boxed{3}, no wait, \boxed{4}.", "4", 1.0),
        (r"First \boxed{4}, no wait, \boxed{3}.", "4", 0.0),
        ("The answer is 4.", "4", 0.0),
        (r"\boxed{4", "4", 0.0),
    ],
)
def test_compute_math_reward(completion: str, truth: str, reward: float) -> None:
    assert compute_math_reward(completion, truth, data_source="math", extra=1) == reward
