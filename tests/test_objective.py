"""The objective's settings and its micro-batch loss, without a Trainer, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from lit_agentrl.config.training import Loss
from lit_agentrl.training import losses
from lit_agentrl.training.batching import TrainingSample, collate
from lit_agentrl.training.losses import LossScale
from lit_agentrl.training.objective import loss_scale, micro_batch_loss

# Two sequences of 2 trained tokens each over a vocabulary of 2. Zero logits: every token has p = 1/2.
SAMPLES = [
    TrainingSample([0, 1], [1, 0], [1, 1], [math.log(0.5)] * 2, advantage=2.0),
    TrainingSample([1, 1], [0, 1], [1, 1], [math.log(0.5)] * 2, advantage=-1.0),
]
LOGITS = torch.zeros(2, 2, 2)


def loss_of(settings: Loss, reference_logits: torch.Tensor | None = None) -> tuple[float, dict[str, float]]:
    micro = collate([[s] for s in SAMPLES], pad_id=0)
    policy = losses.token_logprobs(LOGITS, micro.targets, with_entropy=True)
    reference = None if reference_logits is None else losses.token_logprobs(reference_logits, micro.targets).logprobs
    loss, stats = micro_batch_loss(settings, None, micro, policy, loss_scale(SAMPLES), reference)
    return float(loss), stats


def test_on_policy_loss_is_minus_the_mean_advantage_and_stats_are_token_sums():
    loss, stats = loss_of(Loss())
    # ratio 1 everywhere: per-token loss -A, token mean (-2 - 2 + 1 + 1) / 4
    assert loss == pytest.approx(-0.5)
    assert stats["train/ratio_mean"] == pytest.approx(4.0)  # sums over the 4 tokens, divided later
    assert stats["train/entropy"] == pytest.approx(4 * math.log(2))
    assert stats["train/clip_frac"] == 0.0 and "train/kl" not in stats


def test_entropy_bonus_and_kl_terms():
    loss, _ = loss_of(Loss(entropy_coef=0.1))
    assert loss == pytest.approx(-0.5 - 0.1 * math.log(2))
    # reference p(target) = 0.8 on every token: k3 = exp(ref - pi) - (ref - pi) - 1 with ref - pi = log(1.6)
    reference = torch.zeros(2, 2, 2)
    reference.scatter_(-1, torch.tensor([[1, 0], [0, 1]]).unsqueeze(-1), math.log(4.0))
    k3 = 1.6 - math.log(1.6) - 1
    loss, stats = loss_of(Loss(kl_coef=0.5), reference)
    assert loss == pytest.approx(-0.5 + 0.5 * k3)
    assert stats["train/kl"] == pytest.approx(4 * k3)
    with pytest.raises(ValueError, match="reference"):
        loss_of(Loss(kl_coef=0.5))


def test_sequence_aggregation_divides_by_the_mini_batch_sequence_count():
    # per sequence: mean of -2, -2 and of 1, 1 -> -2 and 1, over 2 sequences
    loss, _ = loss_of(Loss(aggregation="seq-mean-token-mean"))
    assert loss == pytest.approx(-0.5)
    loss, _ = loss_of(Loss(aggregation="seq-mean-token-sum"))
    assert loss == pytest.approx((-4 + 2) / 2)
    assert loss_scale(SAMPLES) == LossScale(tokens=4.0, sequences=2.0)


def test_a_new_aggregation_is_one_function_and_its_name(monkeypatch):
    from lit_agentrl.config import choices

    def token_sum(values, mask, scale, sequence_index):
        return (values * mask).sum()

    monkeypatch.setitem(losses.AGGREGATIONS, "token-sum", token_sum)
    monkeypatch.setattr(choices, "AGGREGATIONS", (*choices.AGGREGATIONS, "token-sum"))
    loss, _ = loss_of(Loss(aggregation="token-sum"))
    assert loss == pytest.approx(-2.0)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"clip_ratio_low": 1.0}, r"model\.loss\.clip_ratio_low must be in"),
        ({"clip_ratio_high": -0.1}, r"model\.loss\.clip_ratio_high"),
        ({"kl_coef": -1.0}, r"model\.loss\.kl_coef"),
        ({"entropy_coef": -1.0}, r"model\.loss\.entropy_coef"),
        ({"aggregation": "sum"}, r"model\.loss\.aggregation must be one of \['token-mean', 'seq-mean-token-mean'"),
    ],
)
def test_bad_settings_name_the_config_key(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        Loss(**kwargs)
