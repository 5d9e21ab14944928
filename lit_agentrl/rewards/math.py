"""The ``math`` reward: the last ``\\boxed{...}`` answer of a completion checked against the ground truth.

Extraction is :mod:`lit_agentrl.rewards.boxed` (shared with the MATH data preparation script); equivalence is
delegated to ``math-verify`` (LaTeX -> sympy, then numeric/symbolic checks).
"""

from __future__ import annotations

import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from lit_agentrl.rewards.boxed import extract_boxed_answer, last_boxed_only_string
from lit_agentrl.rewards.registry import register_reward

__all__ = [
    "MAX_ANSWER_CHARS",
    "compute_math_reward",
    "extract_boxed_answer",
    "ground_truth_problem",
    "is_equiv",
    "last_boxed_only_string",
]

MAIN_THREAD_TIMEOUT_S = 3
"""Per-call parse/verify timeout (whole seconds; math-verify uses ``signal.alarm``)."""

MAX_ANSWER_CHARS = 1000
"""Longer answers are rejected. Off the main thread (the rollout manager's reward pool, an agent's executor)
math-verify runs without a timeout, so this is the only bound there; it does not stop every short pathological
answer (a power tower such as ``9^{9^{9^{9}}}`` holds the interpreter lock in sympy's integer arithmetic)."""

_EXTRACTION_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


def _timeout_s() -> int | None:
    """math-verify's timeout uses ``signal.alarm``, which raises off the main thread."""
    if threading.current_thread() is threading.main_thread():
        return MAIN_THREAD_TIMEOUT_S
    return None


def _normalise(text: str) -> str:
    return "".join(text.split())


def _parse_answer(answer: str, timeout_s: int | None) -> list[object]:
    """Parse a bare answer, preferring a ``\\boxed{}`` wrap so LaTeX extraction anchors on it.

    Falls back to the raw string (e.g. already ``$``-delimited) when the wrap
    yields no sympy object; a string-only fallback result is kept as last resort.
    """
    fallback: list[object] = []
    for candidate in (f"\\boxed{{{answer}}}", answer):
        parsed = parse(
            candidate,
            extraction_config=_EXTRACTION_CONFIG,
            parsing_timeout=timeout_s,  # None disables the alarm
        )
        if any(not isinstance(item, str) for item in parsed):
            return parsed
        fallback = fallback or parsed
    return fallback


def is_equiv(pred: str, ground_truth: str) -> bool:
    """Whether ``pred`` and ``ground_truth`` are the same mathematical answer.

    Handles ``\\frac{1}{2}``/``0.5``/``1/2``, ``\\sqrt{8}``/``2\\sqrt{2}``,
    intervals, ``x=3``/``3`` and similar via math-verify. Never raises: any
    error, empty input or input over ``MAX_ANSWER_CHARS`` gives False.
    Safe to call from worker threads (the alarm-based timeout is then disabled).
    """
    try:
        if not pred.strip() or not ground_truth.strip():
            return False
        if _normalise(pred) == _normalise(ground_truth):
            return True  # cheap, and covers answers sympy cannot parse
        if max(len(pred), len(ground_truth)) > MAX_ANSWER_CHARS:
            return False
        timeout_s = _timeout_s()
        gold = _parse_answer(ground_truth, timeout_s)
        target = _parse_answer(pred, timeout_s)
        if not gold or not target:
            return False
        # verify is asymmetric (gold first), e.g. for "x=3" vs "3" simplification.
        return bool(verify(gold, target, timeout_seconds=timeout_s))
    except (Exception, TimeoutException):  # a reward must never crash a rollout
        return False  # (TimeoutException derives from BaseException, hence listed)


@register_reward("math")
def compute_math_reward(completion: str, ground_truth: str, **row: object) -> float:
    """1.0 if the completion's last boxed answer equals ``ground_truth``, else 0.0.

    ``row`` holds the dataset row's other fields and is ignored.
    """
    answer = extract_boxed_answer(completion)
    if answer is None:
        return 0.0
    return 1.0 if is_equiv(answer, ground_truth) else 0.0


def ground_truth_problem(ground_truth: object) -> str | None:
    """Why ``ground_truth`` cannot serve as a math answer key (checked at setup), or None."""
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        return f"must be a non-empty string, got {ground_truth!r}"
    if len(ground_truth) > MAX_ANSWER_CHARS:
        return f"is longer than {MAX_ANSWER_CHARS} characters"
    try:
        parsed = _parse_answer(ground_truth, _timeout_s())
    except (Exception, TimeoutException):
        parsed = []
    if not any(not isinstance(item, str) for item in parsed):
        return f"{ground_truth!r} cannot be parsed by math-verify into an expression, so no answer could match it"
    return None


compute_math_reward.check_ground_truth = ground_truth_problem  # type: ignore[attr-defined]  # a function attribute (RewardFn)
