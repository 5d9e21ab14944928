"""The LoRA quickstart's base: the quickstart model taught to answer ``a =`` with a digit, mostly ``a``, leaving the
task (``(a + 1) % 10``) findable by sampling; built the same way every time."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_agentrl.models.tiny_pretrain import _prompt, pretrain


@pytest.fixture(scope="module")
def pretrained(quickstart_model_dir, tmp_path_factory):
    return pretrain(quickstart_model_dir, tmp_path_factory.mktemp("lora-base"))


def answer_probabilities(path) -> torch.Tensor:
    """[10, 10]: row a, the probability of each digit after ``a =``."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    digits = [tokenizer.encode(str(d), add_special_tokens=False)[0] for d in range(10)]
    with torch.no_grad():
        rows = [
            torch.softmax(model(input_ids=torch.tensor([_prompt(tokenizer, a)])).logits[0, -1], -1) for a in range(10)
        ]
    return torch.stack(rows)[:, digits]


def test_the_base_answers_with_digits_mostly_a_and_leaves_the_task_to_find(pretrained, quickstart_model_dir):
    before, after = answer_probabilities(quickstart_model_dir), answer_probabilities(pretrained)
    assert before.sum(-1).mean() < 0.5 < 0.9 < after.sum(-1).mean()  # digits, where the random model said anything
    assert after.diagonal().mean() == pytest.approx(0.55, abs=0.05)  # a itself: 0.5 + 0.05
    task = after[torch.arange(10), (torch.arange(10) + 1) % 10]
    assert task.min() > 0.02  # (a + 1) % 10 is sampled now and then: RL can find it


def test_the_base_is_built_the_same_way_every_time(pretrained, quickstart_model_dir, tmp_path):
    again = AutoModelForCausalLM.from_pretrained(pretrain(quickstart_model_dir, tmp_path)).state_dict()
    first = AutoModelForCausalLM.from_pretrained(pretrained).state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
