"""The one ``\\boxed{}`` reader shared by the math reward and the MATH data preparation script."""

from __future__ import annotations

import pytest

from lit_agentrl.rewards import math as math_reward
from lit_agentrl.rewards.boxed import extract_boxed_answer, last_boxed_only_string


def test_the_math_reward_uses_the_shared_reader() -> None:
    assert math_reward.extract_boxed_answer is extract_boxed_answer
    assert math_reward.last_boxed_only_string is last_boxed_only_string


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        # nested braces stay whole
        (r"\boxed{\frac{\sqrt{2}}{3}}", r"\frac{\sqrt{2}}{3}"),
        (r"\boxed{\left\{ x^{2} : x \in \{1, 2\} \right\}}", r"\left\{ x^{2} : x \in \{1, 2\} \right\}"),
        (r"\boxed{a_{b_{c}}}", "a_{b_{c}}"),
        # several boxes: the last one, whatever its command and nesting
        (r"\boxed{\frac{1}{2}} or rather \boxed{x^{2}}", "x^{2}"),
        (r"$\boxed{1}$, $\boxed{2}$ and $\fbox{\frac{3}{4}}$", r"\frac{3}{4}"),
        (r"\fbox{\boxed{5}} then \boxed{\boxed{6}}", "6"),
        (r"\boxed{1} \boxed{\text{no {box} here}}", r"\text{no {box} here}"),
        # a longer command name is another command: the box before it counts
        (r"\boxed{3} then \boxedx", "3"),
        (r"\fbox{2}\fboxsep", "2"),
        # the brace-less form takes one token, as TeX does after a command name
        (r"\boxed5", "5"),
        (r"so \boxed 12, done", "12"),
        (r"$\frac{\boxed 5}{2}$", "5"),
        # the content is stripped
        (r"\boxed{ 7 }", "7"),
    ],
)
def test_last_box_answer(text: str, answer: str) -> None:
    assert extract_boxed_answer(text) == answer


@pytest.mark.parametrize("text", [r"\boxed{}", r"\boxed{  }", r"\boxed{3} and \boxed{", r"\boxed$", ""])
def test_no_answer(text: str) -> None:
    assert extract_boxed_answer(text) is None


def test_an_empty_box_is_a_box_without_an_answer() -> None:
    assert last_boxed_only_string(r"x \boxed{} y") == r"\boxed{}"
    assert extract_boxed_answer(r"x \boxed{} y") is None
