"""The Geometry3K reward (``data_source: hiyouga/geometry3k``), with the seed's geo3k reward functions.

:func:`acc_reward` and :func:`format_reward` keep the seed's names, signatures and meaning, so a seed agent that
imports them runs with its import line changed: ``acc_reward(predict_str, ground_truth, use_boxed=True)`` is 1.0
when the answer (the last ``\\boxed{}`` of the text, or with ``use_boxed=False`` the whole text, e.g. a tool
call's ``answer`` argument) is the ground truth, checked with math-verify (:func:`lit_agentrl.rewards.math.is_equiv`,
thread-safe), else 0.0. The registered reward ``geo3k`` is the seed's rule reward for Geometry3K,
:func:`compute_score`: 0.9 for the right boxed answer plus 0.1 for the format (reasoning in ``<think>`` tags, then
the boxed answer).
"""

from __future__ import annotations

import re

from lit_agentrl.rewards.boxed import extract_boxed_answer
from lit_agentrl.rewards.math import MAX_ANSWER_CHARS, is_equiv
from lit_agentrl.rewards.registry import register_reward

__all__ = ["DATA_SOURCE", "acc_reward", "compute_score", "format_reward", "geo3k_reward"]

DATA_SOURCE = "hiyouga/geometry3k"
"""The rows' ``data_source`` (``data/prepare_geo3k.py``), which selects the ``geo3k`` reward."""

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(predict_str: str) -> float:
    """1.0 when the text reasons in ``<think>...</think>`` and then gives a ``\\boxed{}`` answer, else 0.0."""
    return 1.0 if _FORMAT.fullmatch(predict_str.strip()) else 0.0


def acc_reward(predict_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    """1.0 when the answer equals ``ground_truth`` (math-verify), else 0.0; with ``use_boxed`` the answer is the
    last ``\\boxed{}`` (none: 0.0), otherwise the whole ``predict_str``."""
    answer = extract_boxed_answer(predict_str) if use_boxed else predict_str.strip()
    if answer is None:
        return 0.0
    return 1.0 if is_equiv(answer, str(ground_truth)) else 0.0


def compute_score(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    """``(1 - format_score) * acc_reward + format_score * format_reward``."""
    accuracy = acc_reward(predict_str, ground_truth, use_boxed)
    return (1.0 - format_score) * accuracy + format_score * format_reward(predict_str)


@register_reward("geo3k")
def geo3k_reward(completion: str, ground_truth: str, **row: object) -> float:
    """:func:`compute_score` of the completion (``row`` is ignored): 0.9 accuracy + 0.1 format, as the seed scores
    ``hiyouga/geometry3k`` rows."""
    return compute_score(completion, ground_truth)


def ground_truth_problem(ground_truth: object) -> str | None:
    """Why ``ground_truth`` cannot be a Geometry3K answer key (checked at setup), or None.

    Only its shape is checked: an answer math-verify cannot parse still matches itself character for character.
    """
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        return f"must be a non-empty string, got {ground_truth!r}"
    if len(ground_truth) > MAX_ANSWER_CHARS:
        return f"is longer than {MAX_ANSWER_CHARS} characters"
    return None


geo3k_reward.check_ground_truth = ground_truth_problem  # type: ignore[attr-defined]  # a function attribute (RewardFn)
