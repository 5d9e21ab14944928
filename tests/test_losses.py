"""The GRPO maths in ``lit_agentrl.training.losses`` against hand-computed numbers.

Every expected value below is written out by hand (or with plain ``math``) for a tiny input, never by
re-running the same torch expressions, so a wrong formula, a swapped sign or a wrong reduction fails.
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_agentrl.training.losses import (
    LossScale,
    aggregate,
    clipped_policy_loss,
    grpo_advantages,
    kl_to_reference,
    token_logprobs,
)

EPS = 1e-6  # grpo_advantages' default eps: advantage = centered / (std + eps)


def _f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _assert_close(actual: torch.Tensor, expected, tol: float = 1e-9) -> None:
    """Element-wise |actual - expected| <= tol, with ``expected`` a (nested) list of Python floats."""
    got = actual.detach().to(torch.float64).flatten().tolist()
    want = torch.tensor(expected, dtype=torch.float64).flatten().tolist()
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=tol), (got, want)


# ---------------------------------------------------------------------------------------------------------
# grpo_advantages
# ---------------------------------------------------------------------------------------------------------


def test_grpo_advantages_divide_by_the_sample_std_by_default():
    # group 0: rewards 1, 2, 3, 6 -> mean 3, centered -2, -1, 0, 3, squares sum 14: sample var 14/3
    # group 1: rewards 0, 1       -> mean 0.5, centered -0.5, 0.5, squares sum 0.5: sample var 0.5 / 1
    rewards = _f64([1.0, 2.0, 3.0, 6.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    out = grpo_advantages(rewards, groups)
    s0 = math.sqrt(14 / 3) + EPS
    s1 = math.sqrt(0.5) + EPS
    _assert_close(out.advantages, [-2 / s0, -1 / s0, 0.0, 3 / s0, -0.5 / s1, 0.5 / s1])
    assert out.advantages[5].item() == pytest.approx(0.7071, abs=1e-4)  # torch.std's (TRL, verl), not +-1
    assert out.num_groups == 2
    assert out.num_flat_groups == 0


def test_grpo_advantages_population_std_divides_by_n():
    # the same groups: population var 14/4 = 3.5 and 0.5/2 = 0.25 (std 0.5: group 1 becomes exactly -+1)
    rewards = _f64([1.0, 2.0, 3.0, 6.0, 0.0, 1.0])
    out = grpo_advantages(rewards, torch.tensor([0, 0, 0, 0, 1, 1]), std="population")
    s0 = math.sqrt(3.5) + EPS
    s1 = 0.5 + EPS
    _assert_close(out.advantages, [-2 / s0, -1 / s0, 0.0, 3 / s0, -0.5 / s1, 0.5 / s1])
    with pytest.raises(ValueError, match=r"model\.advantage_std must be one of \['sample', 'population', 'none'\]"):
        grpo_advantages(rewards, torch.tensor([0, 0, 0, 0, 1, 1]), std="unbiased")


def test_grpo_advantages_dr_grpo_is_centered_only():
    rewards = _f64([1.0, 2.0, 3.0, 6.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    out = grpo_advantages(rewards, groups, std="none")
    _assert_close(out.advantages, [-2.0, -1.0, 0.0, 3.0, -0.5, 0.5], tol=1e-12)
    assert out.num_groups == 2
    assert out.num_flat_groups == 0


def test_grpo_advantages_flat_group_is_zero_and_counted():
    # group 5 has rewards 4, 4, 4: mean 4, std 0 -> advantages exactly 0, a flat group
    # group 9 has rewards 0, 2: mean 1, sample std sqrt(2) -> -1/sqrt(2), 1/sqrt(2)
    rewards = _f64([4.0, 4.0, 4.0, 0.0, 2.0])
    groups = torch.tensor([5, 5, 5, 9, 9])
    out = grpo_advantages(rewards, groups)
    s9 = math.sqrt(2) + EPS
    _assert_close(out.advantages, [0.0, 0.0, 0.0, -1 / s9, 1 / s9])
    assert torch.isfinite(out.advantages).all()
    assert out.num_groups == 2
    assert out.num_flat_groups == 1

    all_flat = grpo_advantages(_f64([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1]))
    _assert_close(all_flat.advantages, [0.0, 0.0, 0.0, 0.0], tol=0.0)
    assert all_flat.num_flat_groups == 2
    assert all_flat.num_groups == 2


def test_grpo_advantages_interleaved_groups():
    # groups [0, 1, 0, 1]: group 0 has rewards 1, 3 (mean 2, population std 1), group 1 has 10, 20 (mean 15, std 5)
    rewards = _f64([1.0, 10.0, 3.0, 20.0])
    groups = torch.tensor([0, 1, 0, 1])
    out = grpo_advantages(rewards, groups, std="population")
    _assert_close(out.advantages, [-1 / (1 + EPS), -5 / (5 + EPS), 1 / (1 + EPS), 5 / (5 + EPS)])
    centered = grpo_advantages(rewards, groups, std="none")
    _assert_close(centered.advantages, [-1.0, -5.0, 1.0, 5.0], tol=1e-12)
    assert out.num_groups == 2


def test_grpo_advantages_non_contiguous_ids():
    # ids 7 and 3, interleaved: group 7 = rewards 1, 3 (mean 2, sample var 2 / 1, std sqrt(2));
    # group 3 = rewards 10, 20, 30 (mean 20, centered -10, 0, 10, sample var 200/2, std 10)
    rewards = _f64([1.0, 10.0, 3.0, 20.0, 30.0])
    groups = torch.tensor([7, 3, 7, 3, 3])
    out = grpo_advantages(rewards, groups)
    s7, s3 = math.sqrt(2) + EPS, 10 + EPS
    _assert_close(out.advantages, [-1 / s7, -10 / s3, 1 / s7, 0.0, 10 / s3])
    centered = grpo_advantages(rewards, groups, std="none")
    _assert_close(centered.advantages, [-1.0, -10.0, 1.0, 0.0, 10.0], tol=1e-12)
    assert out.num_groups == 2
    assert out.num_flat_groups == 0


def test_grpo_advantages_num_groups_counts_distinct_ids():
    rewards = _f64([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert grpo_advantages(rewards, torch.tensor([0, 0, 0, 0, 0, 0])).num_groups == 1
    assert grpo_advantages(rewards, torch.tensor([2, 4, 6, 2, 4, 6])).num_groups == 3
    singles = grpo_advantages(rewards, torch.tensor([0, 1, 2, 3, 4, 5]))
    assert singles.num_groups == 6
    # a group of one trajectory has zero advantage and is flat (its sample std, 0 / 0, is taken as 0, not NaN)
    _assert_close(singles.advantages, [0.0] * 6, tol=0.0)
    assert singles.num_flat_groups == 6
    assert grpo_advantages(rewards, torch.arange(6), std="population").num_flat_groups == 6


# ---------------------------------------------------------------------------------------------------------
# token_logprobs
# ---------------------------------------------------------------------------------------------------------


def _logits_123(dtype=torch.float32) -> torch.Tensor:
    # [B=1, L=3, V=3]: the same logits [1, 2, 3] at each of the three positions
    return torch.tensor([[[1.0, 2.0, 3.0]] * 3], dtype=dtype)


TARGETS = torch.tensor([[0, 1, 2]])


def test_token_logprobs_temperature_1():
    z = math.exp(1) + math.exp(2) + math.exp(3)
    expected = [1 - math.log(z), 2 - math.log(z), 3 - math.log(z)]  # ~ -2.4076, -1.4076, -0.4076
    out = token_logprobs(_logits_123(), TARGETS)
    assert out.logprobs.shape == (1, 3)
    _assert_close(out.logprobs, [expected], tol=1e-6)
    assert out.logprobs[0, 2].item() == pytest.approx(-0.40760596, abs=1e-6)
    assert out.entropy is None


def test_token_logprobs_temperature_2():
    # logits / 2 = 0.5, 1, 1.5
    z = math.exp(0.5) + math.exp(1.0) + math.exp(1.5)
    expected = [0.5 - math.log(z), 1.0 - math.log(z), 1.5 - math.log(z)]  # ~ -1.6803, -1.1803, -0.6803
    out = token_logprobs(_logits_123(), TARGETS, temperature=2.0)
    _assert_close(out.logprobs, [expected], tol=1e-6)
    assert out.logprobs[0, 0].item() == pytest.approx(-1.68026967, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_token_logprobs_entropy_by_hand(temperature):
    scaled = [1.0 / temperature, 2.0 / temperature, 3.0 / temperature]
    z = sum(math.exp(s) for s in scaled)
    probs = [math.exp(s) / z for s in scaled]
    entropy = -sum(p * math.log(p) for p in probs)  # T=1: ~0.83240, T=2: ~1.02019
    out = token_logprobs(_logits_123(), TARGETS, temperature=temperature, with_entropy=True)
    assert out.entropy is not None
    assert out.entropy.shape == (1, 3)
    _assert_close(out.entropy, [[entropy] * 3], tol=1e-6)
    # the log-probs do not change when entropy is also asked for
    _assert_close(out.logprobs, [[math.log(p) for p in probs]], tol=1e-6)


def test_token_logprobs_entropy_known_values():
    assert token_logprobs(_logits_123(), TARGETS, with_entropy=True).entropy[0, 0].item() == pytest.approx(
        0.83239558, abs=1e-6
    )
    # uniform logits over V=3: entropy log 3, every log-prob -log 3
    out = token_logprobs(torch.zeros(1, 2, 3), torch.tensor([[0, 2]]), with_entropy=True)
    _assert_close(out.entropy, [[math.log(3), math.log(3)]], tol=1e-6)
    _assert_close(out.logprobs, [[-math.log(3), -math.log(3)]], tol=1e-6)


def test_token_logprobs_entropy_none_without_flag():
    assert token_logprobs(_logits_123(), TARGETS).entropy is None
    assert token_logprobs(_logits_123(), TARGETS, with_entropy=False).entropy is None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_gradient_matches_categorical_and_detached_entropy_has_none(temperature):
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
    targets = torch.tensor([[0, 4, 2], [1, 1, 3]])
    live = token_logprobs(logits, targets, temperature, with_entropy=True)
    detached = token_logprobs(logits, targets, temperature, with_entropy=True, entropy_grad=False)
    assert live.entropy.requires_grad and not detached.entropy.requires_grad
    torch.testing.assert_close(live.entropy, detached.entropy)
    torch.testing.assert_close(live.logprobs, detached.logprobs)
    (grad,) = torch.autograd.grad(live.entropy.sum(), logits)
    expected = torch.distributions.Categorical(logits=logits / temperature).entropy().sum()
    (expected_grad,) = torch.autograd.grad(expected, logits)
    torch.testing.assert_close(grad, expected_grad)


def test_token_logprobs_float32_from_bfloat16():
    # 1, 2 and 3 are exact in bfloat16, so the float32 result matches the hand-computed values
    out = token_logprobs(_logits_123(torch.bfloat16), TARGETS, with_entropy=True)
    assert out.logprobs.dtype == torch.float32
    assert out.entropy.dtype == torch.float32
    z = math.exp(1) + math.exp(2) + math.exp(3)
    _assert_close(out.logprobs, [[1 - math.log(z), 2 - math.log(z), 3 - math.log(z)]], tol=1e-6)
    _assert_close(out.entropy, [[0.83239558] * 3], tol=1e-6)


def test_token_logprobs_positions_and_batch_are_independent():
    # B=2, L=2, V=2: each row picks its own target under its own logits
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)]], [[math.log(4.0), 0.0], [2.0, 2.0]]])
    targets = torch.tensor([[1, 1], [0, 1]])
    out = token_logprobs(logits, targets)
    # p = 1/2, 3/4, 4/5, 1/2
    _assert_close(out.logprobs, [[math.log(0.5), math.log(0.75)], [math.log(0.8), math.log(0.5)]], tol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# aggregate
# ---------------------------------------------------------------------------------------------------------

VALUES = _f64([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
RAGGED = torch.tensor([[1, 1, 1], [1, 0, 0]])  # row 0 keeps 1, 2, 3; row 1 keeps 4


def test_aggregate_token_mean():
    # (1 + 2 + 3 + 4) / 4 tokens
    assert aggregate(VALUES, RAGGED, "token-mean").item() == pytest.approx(2.5, abs=1e-12)


def test_aggregate_seq_mean_token_mean():
    # row means 6/3 = 2 and 4/1 = 4, then (2 + 4) / 2
    assert aggregate(VALUES, RAGGED, "seq-mean-token-mean").item() == pytest.approx(3.0, abs=1e-12)


def test_aggregate_seq_mean_token_sum():
    # row sums 6 and 4, then (6 + 4) / 2
    assert aggregate(VALUES, RAGGED, "seq-mean-token-sum").item() == pytest.approx(5.0, abs=1e-12)


def test_aggregate_bool_mask_same_as_int_mask():
    bool_mask = RAGGED.bool()
    assert aggregate(VALUES, bool_mask, "token-mean").item() == pytest.approx(2.5, abs=1e-12)
    assert aggregate(VALUES, bool_mask, "seq-mean-token-mean").item() == pytest.approx(3.0, abs=1e-12)
    assert aggregate(VALUES, bool_mask, "seq-mean-token-sum").item() == pytest.approx(5.0, abs=1e-12)


def test_aggregate_token_mean_shared_scale_adds_up_over_micro_batches():
    a_values, a_mask = _f64([[1.0, 2.0, 3.0]]), torch.tensor([[1, 1, 0]])  # sum 3 over 2 tokens
    b_values = _f64([[4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    b_mask = torch.tensor([[1, 1, 1], [0, 0, 1]])  # sum 15 + 9 = 24 over 4 tokens
    # the concatenation: 27 over 6 tokens = 4.5
    full = aggregate(torch.cat([a_values, b_values]), torch.cat([a_mask, b_mask]), "token-mean")
    assert full.item() == pytest.approx(4.5, abs=1e-12)

    part_a = aggregate(a_values, a_mask, "token-mean", LossScale(tokens=6, sequences=3))
    part_b = aggregate(b_values, b_mask, "token-mean", LossScale(tokens=6, sequences=3))
    assert part_a.item() == pytest.approx(0.5, abs=1e-12)  # 3 / 6
    assert part_b.item() == pytest.approx(4.0, abs=1e-12)  # 24 / 6
    assert (part_a + part_b).item() == pytest.approx(4.5, abs=1e-12)
    # without the shared scale each micro-batch is its own mean and they do not add up: 1.5 + 6
    own = aggregate(a_values, a_mask, "token-mean") + aggregate(b_values, b_mask, "token-mean")
    assert own.item() == pytest.approx(7.5, abs=1e-12)


def test_aggregate_sequence_variants_scale_overrides_sequence_count():
    scale = LossScale(tokens=99, sequences=4)  # the token count must not matter here
    # row sums 6 and 4 over 4 sequences of the whole mini-batch
    assert aggregate(VALUES, RAGGED, "seq-mean-token-sum", scale).item() == pytest.approx(2.5, abs=1e-12)
    # row means 2 and 4 over 4 sequences
    assert aggregate(VALUES, RAGGED, "seq-mean-token-mean", scale).item() == pytest.approx(1.5, abs=1e-12)


def test_aggregate_unknown_raises_value_error_naming_options():
    with pytest.raises(ValueError) as excinfo:
        aggregate(VALUES, RAGGED, "sum")  # type: ignore[arg-type]
    message = str(excinfo.value)
    assert "'sum'" in message
    for option in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert option in message


# ---------------------------------------------------------------------------------------------------------
# clipped_policy_loss
# ---------------------------------------------------------------------------------------------------------


def _one_token(ratio: float, advantage: float, **kwargs):
    """One masked token whose new/old probability ratio is ``ratio``, old log-prob -1.3."""
    old = _f64([[-1.3]])
    new = old + math.log(ratio)
    return clipped_policy_loss(new, old, _f64([advantage]), torch.tensor([[1]]), **kwargs)


def test_clipped_loss_ratio_inside_clip_range_is_minus_r_times_a():
    loss, stats = _one_token(1.1, 2.0)
    assert loss.item() == pytest.approx(-2.2, abs=1e-9)  # -(1.1 * 2)
    assert stats.clip_frac.item() == 0.0
    loss, stats = _one_token(0.9, -3.0)
    assert loss.item() == pytest.approx(2.7, abs=1e-9)  # -(0.9 * -3)
    assert stats.clip_frac.item() == 0.0


def test_clipped_loss_positive_advantage_clipped_above():
    # r = 1.5 > 1 + 0.2: min(1.5 * 2, 1.2 * 2) = 2.4
    loss, stats = _one_token(1.5, 2.0, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(-2.4, abs=1e-9)
    assert stats.clip_frac.item() == pytest.approx(1.0)
    # with a higher clip_high the bound moves: 1 + 0.3
    loss, stats = _one_token(1.5, 2.0, clip_low=0.2, clip_high=0.3)
    assert loss.item() == pytest.approx(-2.6, abs=1e-9)
    assert stats.clip_frac.item() == pytest.approx(1.0)


def test_clipped_loss_negative_advantage_clipped_below():
    # r = 0.5 < 1 - 0.2, A = -2: min(0.5 * -2, 0.8 * -2) = min(-1, -1.6) = -1.6
    loss, stats = _one_token(0.5, -2.0, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(1.6, abs=1e-9)
    assert stats.clip_frac.item() == pytest.approx(1.0)
    # clip_low 0.3: bound 0.7
    loss, stats = _one_token(0.5, -2.0, clip_low=0.3, clip_high=0.2)
    assert loss.item() == pytest.approx(1.4, abs=1e-9)
    assert stats.clip_frac.item() == pytest.approx(1.0)


def test_clipped_loss_pessimistic_side_is_not_clipped():
    # positive A with a small ratio: min(0.5 * 2, 0.8 * 2) = 1.0, the unclipped term, not counted as clipped
    loss, stats = _one_token(0.5, 2.0)
    assert loss.item() == pytest.approx(-1.0, abs=1e-9)
    assert stats.clip_frac.item() == 0.0
    # negative A with a large ratio: min(1.5 * -2, 1.2 * -2) = -3, the unclipped term
    loss, stats = _one_token(1.5, -2.0)
    assert loss.item() == pytest.approx(3.0, abs=1e-9)
    assert stats.clip_frac.item() == 0.0


def test_clipped_loss_asymmetric_clip_differs_from_symmetric():
    # r = 1.25, A = 1: symmetric 0.2 clips to 1.2; clip-higher 0.28 lets 1.25 through
    sym_loss, sym_stats = _one_token(1.25, 1.0, clip_low=0.2, clip_high=0.2)
    asym_loss, asym_stats = _one_token(1.25, 1.0, clip_low=0.2, clip_high=0.28)
    assert sym_loss.item() == pytest.approx(-1.2, abs=1e-9)
    assert sym_stats.clip_frac.item() == pytest.approx(1.0)
    assert asym_loss.item() == pytest.approx(-1.25, abs=1e-9)
    assert asym_stats.clip_frac.item() == 0.0
    # r = 1.4: clipped at 1.28 under clip-higher
    asym_loss, _ = _one_token(1.4, 1.0, clip_low=0.2, clip_high=0.28)
    assert asym_loss.item() == pytest.approx(-1.28, abs=1e-9)
    # the low side is the same in both: r = 0.7, A = -1 -> min(-0.7, -0.8) = -0.8
    sym_low, _ = _one_token(0.7, -1.0, clip_low=0.2, clip_high=0.2)
    asym_low, _ = _one_token(0.7, -1.0, clip_low=0.2, clip_high=0.28)
    assert sym_low.item() == pytest.approx(0.8, abs=1e-9)
    assert asym_low.item() == pytest.approx(0.8, abs=1e-9)


def test_clipped_loss_on_policy_value_and_gradient():
    # logprobs == old_logprobs: r = 1 everywhere, so loss = -mean(A over masked tokens)
    old = _f64([[-0.5, -1.0, -2.0], [-0.1, -0.7, -3.0]])
    logprobs = old.clone().requires_grad_(True)
    advantages = _f64([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # masked tokens carry A = 2, 2, -1
    loss, stats = clipped_policy_loss(logprobs, old, advantages, mask)
    assert loss.item() == pytest.approx(-(2.0 + 2.0 - 1.0) / 3, abs=1e-12)
    loss.backward()
    # d loss / d logprob = -A * r / num_tokens = -A / 3 on masked tokens, 0 elsewhere
    _assert_close(logprobs.grad, [[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]], tol=1e-12)
    assert stats.clip_frac.item() == 0.0
    assert stats.ratio_mean.item() == pytest.approx(1.0, abs=1e-12)
    assert stats.approx_kl.item() == pytest.approx(0.0, abs=1e-12)


def test_clipped_loss_gradient_off_policy_by_hand():
    # inside the range the gradient is -A * r / n; a clipped token gets no gradient
    old = _f64([[0.0, 0.0]])
    logprobs = _f64([[math.log(1.1), math.log(1.5)]]).requires_grad_(True)
    loss, stats = clipped_policy_loss(logprobs, old, _f64([1.0]), torch.tensor([[1, 1]]))
    assert loss.item() == pytest.approx(-(1.1 + 1.2) / 2, abs=1e-9)
    loss.backward()
    _assert_close(logprobs.grad, [[-1.1 / 2, 0.0]], tol=1e-9)
    assert stats.clip_frac.item() == pytest.approx(0.5)


def test_clipped_loss_masked_tokens_contribute_nothing():
    old = _f64([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    new = _f64([[-0.9, -1.1, -1.0], [-2.05, -1.9, -2.0]])
    advantages = _f64([1.5, -0.5])
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]])
    base_loss, base_stats = clipped_policy_loss(new, old, advantages, mask)

    wild_new, wild_old = new.clone(), old.clone()
    off = mask == 0
    wild_new[off] = torch.tensor([5.0, -30.0, 12.0], dtype=torch.float64)
    wild_old[off] = torch.tensor([-40.0, 3.0, -7.0], dtype=torch.float64)
    wild_new.requires_grad_(True)
    loss, stats = clipped_policy_loss(wild_new, wild_old, advantages, mask)
    assert loss.item() == pytest.approx(base_loss.item(), abs=1e-12)
    for got, want in zip(stats, base_stats):
        assert got.item() == pytest.approx(want.item(), abs=1e-12)
    loss.backward()
    assert (wild_new.grad[off] == 0).all()

    # and the value itself, by hand: tokens (r = e^0.1, A = 1.5), (r = e^-0.1, A = 1.5), (r = e^0.1, A = -0.5)
    expected = -(math.exp(0.1) * 1.5 + math.exp(-0.1) * 1.5 + math.exp(0.1) * -0.5) / 3
    assert base_loss.item() == pytest.approx(expected, abs=1e-9)


def test_clipped_loss_stats_by_hand():
    # three tokens, the third masked out: ratios 1.5, 0.9 (and 3.0 ignored), A = 1
    old = _f64([[-1.0, -2.0, -0.5]])
    new = old + _f64([[math.log(1.5), math.log(0.9), math.log(3.0)]])
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = clipped_policy_loss(new, old, _f64([1.0]), mask)
    assert stats.ratio_mean.item() == pytest.approx((1.5 + 0.9) / 2, abs=1e-9)  # 1.2
    # approx_kl = mean(old - new) = -(log 1.5 + log 0.9) / 2 ~ -0.15005
    assert stats.approx_kl.item() == pytest.approx(-(math.log(1.5) + math.log(0.9)) / 2, abs=1e-9)
    assert stats.clip_frac.item() == pytest.approx(0.5)  # only 1.5 is clipped
    assert loss.item() == pytest.approx(-(1.2 + 0.9) / 2, abs=1e-9)


def test_clipped_loss_stats_are_token_means_over_batch():
    # two sequences of unequal length: stats average over masked tokens, not over sequences
    old = _f64([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    new = _f64([[math.log(2.0), math.log(2.0), math.log(2.0)], [math.log(0.5), 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    _, stats = clipped_policy_loss(new, old, _f64([1.0, 1.0]), mask)
    assert stats.ratio_mean.item() == pytest.approx((2 + 2 + 2 + 0.5) / 4, abs=1e-9)
    assert stats.approx_kl.item() == pytest.approx(-(3 * math.log(2.0) + math.log(0.5)) / 4, abs=1e-9)
    assert stats.clip_frac.item() == pytest.approx(3 / 4)  # the three r = 2 tokens with A > 0


def test_clipped_loss_aggregation_and_scale_pass_through():
    # r = 1 everywhere, A = 2 and -1: per-token loss -2, -2, -2 (row 0) and 1 (row 1)
    old = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = _f64([2.0, -1.0])
    loss, _ = clipped_policy_loss(old, old, adv, mask, aggregation="seq-mean-token-mean")
    assert loss.item() == pytest.approx((-2.0 + 1.0) / 2, abs=1e-12)
    loss, _ = clipped_policy_loss(old, old, adv, mask, aggregation="seq-mean-token-sum")
    assert loss.item() == pytest.approx((-6.0 + 1.0) / 2, abs=1e-12)
    loss, _ = clipped_policy_loss(old, old, adv, mask, aggregation="token-mean", scale=LossScale(10, 1))
    assert loss.item() == pytest.approx((-6.0 + 1.0) / 10, abs=1e-12)


# ---------------------------------------------------------------------------------------------------------
# kl_to_reference
# ---------------------------------------------------------------------------------------------------------


def test_kl_to_reference_zero_when_equal():
    logprobs = _f64([[-0.3, -1.7, -5.0], [-0.01, -2.2, -9.0]])
    kl = kl_to_reference(logprobs, logprobs.clone())
    assert kl.shape == (2, 3)
    _assert_close(kl, [[0.0] * 3] * 2, tol=0.0)


def test_kl_to_reference_known_delta():
    # k3 with delta = ref - pi: exp(delta) - delta - 1
    logprobs = _f64([[-1.0, -2.0, -0.5]])
    ref = _f64([[0.0, -3.0, -0.5 + math.log(2.0)]])  # deltas 1, -1, log 2
    kl = kl_to_reference(logprobs, ref)
    expected = [
        math.e - 1 - 1,  # ~0.71828
        math.exp(-1) + 1 - 1,  # ~0.36788
        2.0 - math.log(2.0) - 1,  # ~0.30685
    ]
    _assert_close(kl, [expected], tol=1e-12)
    # the estimator is not symmetric: swapping the arguments swaps which value delta = +-1 gives
    swapped = kl_to_reference(ref, logprobs)
    assert swapped[0, 0].item() == pytest.approx(math.exp(-1), abs=1e-12)
    assert swapped[0, 1].item() == pytest.approx(math.e - 2, abs=1e-12)


def test_kl_to_reference_nonnegative_on_random_inputs():
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(64, 33, generator=gen) * 10
    ref = -torch.rand(64, 33, generator=gen) * 10
    kl = kl_to_reference(logprobs, ref)
    assert kl.shape == (64, 33)
    assert torch.isfinite(kl).all()
    assert (kl >= 0).all()
    assert (kl > 0).any()
    kl64 = kl_to_reference(logprobs.double(), ref.double())
    assert (kl64 >= 0).all()


def test_kl_to_reference_extreme_delta_is_finite():
    # the log-ratio is clamped to [-20, 20]: delta = 100 counts as 20
    kl = kl_to_reference(_f64([[-100.0, 0.0]]), _f64([[0.0, -100.0]]))
    assert kl[0, 0].item() == pytest.approx(math.exp(20) - 20 - 1, rel=1e-12)
    assert kl[0, 1].item() == pytest.approx(math.exp(-20) + 20 - 1, rel=1e-12)


def test_the_configs_names_are_the_implementations_names():
    from lit_agentrl.config import choices
    from lit_agentrl.training.losses import AGGREGATIONS

    assert tuple(AGGREGATIONS) == choices.AGGREGATIONS
