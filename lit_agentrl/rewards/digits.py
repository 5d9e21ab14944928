"""``next_digit``: the quickstart's task. The prompt is ``a =``; the right answer is ``(a + 1) % 10``.

A random tiny model finds the format (one digit, then end of turn) by chance, and GRPO alone then learns
the rule (the quickstart, docs/getting-started.md). The completion is the decoded text after the prompt.
"""

from __future__ import annotations

import re

from lit_agentrl.rewards.registry import register_reward

END_OF_TURN = ("<|im_end|>", "<|endoftext|>")
_ANSWER = re.compile(r"(\d)(?:" + "|".join(re.escape(m) for m in END_OF_TURN) + r")")

FORMAT_CREDIT = 0.2
"""Reward of a well-formed wrong answer (one digit, then end of turn)."""


@register_reward("next_digit")
def next_digit_reward(completion: str, ground_truth: str | None, **row: object) -> float:
    """1.0 for the ground-truth digit then end of turn, ``FORMAT_CREDIT`` for another digit, else 0.0."""
    match = _ANSWER.fullmatch(completion.strip(" "))
    if match is None:
        return 0.0
    return 1.0 if match.group(1) == str(ground_truth) else FORMAT_CREDIT


def _digit_problem(ground_truth: object) -> str | None:
    if isinstance(ground_truth, str) and re.fullmatch(r"\d", ground_truth):
        return None
    return f"must be one digit, got {ground_truth!r}"


next_digit_reward.check_ground_truth = _digit_problem  # type: ignore[attr-defined]  # a function attribute (RewardFn)
