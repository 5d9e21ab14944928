"""Issue 12's algorithm options against values worked out by hand: dual-clip, GSPO's sequence ratio, Dr. GRPO's
constant normaliser, the rollout correction (TIS, MIS), where the old log-probs come from."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lit_agentrl.config.training import Compute, Correction, Loss, Optimizer, Overlong
from lit_agentrl.training.batching import TrainingSample, prepare_samples
from lit_agentrl.training.correction import correction_weights
from lit_agentrl.training.losses import LossScale, aggregate, clipped_policy_loss
from lit_agentrl.types import Trajectory

LOG = math.log


def policy_loss(new: list[float], old: list[float], advantage: float, **kwargs) -> float:
    row = torch.tensor([new])
    loss, _ = clipped_policy_loss(row, torch.tensor([old]), torch.tensor([advantage]), torch.ones_like(row), **kwargs)
    return float(loss)


def test_dual_clip_caps_the_loss_of_negative_advantages_at_c():
    # r = 0.5 / 0.1 = 5, clipped to 1.2. A = -1: -min(5 * -1, 1.2 * -1) = 5; dual-clip at c = 3 caps it at 3.
    assert policy_loss([LOG(0.5)], [LOG(0.1)], -1.0) == pytest.approx(5.0)
    assert policy_loss([LOG(0.5)], [LOG(0.1)], -1.0, clip_ratio_c=3.0) == pytest.approx(3.0)
    # A = +1: -min(5, 1.2) = -1.2 with or without it.
    assert policy_loss([LOG(0.5)], [LOG(0.1)], 1.0, clip_ratio_c=3.0) == pytest.approx(-1.2)


def test_gspo_takes_one_ratio_per_sequence_and_clips_it_as_one():
    # Sequence 0: token ratios 2 and 1/2, geometric mean 1 (inside the clip range): every token gets the gradient
    # -r A / tokens = -1 * 1 / 4 under token-mean. Sequence 1: ratios 3 and 3, mean 3 > 1.2: clipped, no gradient.
    old = torch.tensor([[LOG(0.25), LOG(0.5)], [LOG(0.1), LOG(0.1)]])
    new = torch.tensor([[LOG(0.5), LOG(0.25)], [LOG(0.3), LOG(0.3)]], requires_grad=True)
    mask, advantages = torch.ones(2, 2), torch.tensor([1.0, 1.0])
    loss, stats = clipped_policy_loss(new, old, advantages, mask, sequence_ratio=True)
    loss.backward()
    assert float(loss) == pytest.approx((-1.0 - 1.0 - 1.2 - 1.2) / 4)
    torch.testing.assert_close(new.grad, torch.tensor([[-0.25, -0.25], [0.0, 0.0]]))
    assert float(stats.ratio_mean) == pytest.approx((1 + 1 + 3 + 3) / 4)
    # Token-level ratios would clip token (0, 0) (r = 2) and not token (0, 1) (r = 0.5: gradient -0.5 / 4).
    new.grad = None
    clipped_policy_loss(new, old, advantages, mask)[0].backward()
    torch.testing.assert_close(new.grad[0], torch.tensor([0.0, -0.125]))


def test_dr_grpo_divides_each_sequences_token_sum_by_a_constant_length():
    values = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # sequence sums 2 and 3, mean 2.5, over the constant length 10
    scale = LossScale(tokens=5.0, sequences=2.0, norm_length=10.0)
    assert float(aggregate(values, mask, "seq-mean-token-sum-norm", scale)) == pytest.approx(0.25)
    with pytest.raises(ValueError, match=r"model\.loss\.norm_length"):
        Loss(aggregation="seq-mean-token-sum-norm")


# Trainer (pi_old) 0.5, 0.5, 0.9 and engine (mu) 0.1, 0.5, 0.3 on three trained tokens: w = 5, 1, 3.
OLD = torch.tensor([[LOG(0.5), LOG(0.5), LOG(0.9)]])
ROLLOUT = torch.tensor([[LOG(0.1), LOG(0.5), LOG(0.3)]])
MASK = torch.ones(1, 3)
INDEX = torch.zeros(1, 3, dtype=torch.long)


def test_tis_truncates_the_weights_at_c_and_reports_the_mismatch():
    weights, stats = correction_weights(OLD, ROLLOUT, MASK, INDEX, "tis", threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.0, 2.0]]))
    assert stats["train/is_weight_mean"] == pytest.approx(5.0)  # a sum over tokens, divided by their count later
    assert stats["train/is_clipped_frac"] == pytest.approx(2.0)
    assert stats["train/mismatch_ratio_max"] == pytest.approx(5.0)


def test_mismatch_kl_is_k3_of_kl_from_the_engine_for_tokens_the_engine_sampled():
    # Tokens sampled from mu: with r = pi_old / mu, E_mu[r - 1 - log r] = 1 - 1 + KL(mu || pi_old). Here r = 5, 1, 3:
    # (5 - 1 - ln 5) + 0 + (3 - 1 - ln 3) = 2.3906 + 0.9014 (k3 of the other direction, 1/r - 1 + ln r, would give
    # 0.8094 + 0.4319).
    _, stats = correction_weights(OLD, ROLLOUT, MASK, INDEX, "tis", threshold=2.0)
    assert stats["train/mismatch_kl"] == pytest.approx((5 - 1 - LOG(5)) + (3 - 1 - LOG(3)))
    # Its mean over many tokens drawn from mu is KL(mu || pi_old) itself, computed here from the two distributions.
    mu, pi_old = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    drawn = torch.multinomial(mu, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    old, rollout = pi_old.log()[drawn].unsqueeze(0), mu.log()[drawn].unsqueeze(0)
    mask, index = torch.ones_like(old), torch.zeros_like(old, dtype=torch.long)
    _, stats = correction_weights(old, rollout, mask, index, "tis")
    kl_mu_pi_old = 0.5 * LOG(0.5 / 0.2) + 0.3 * LOG(1.0) + 0.2 * LOG(0.2 / 0.5)  # 0.2749
    assert stats["train/mismatch_kl"] / drawn.numel() == pytest.approx(kl_mu_pi_old, rel=0.02)


def test_sequence_level_tis_weighs_a_sequence_by_the_product_of_its_token_ratios():
    # rho = 5 * 1 * 3 = 15 (its geometric mean, 2.47, is not an importance weight): min(15, C) on every token
    weights, stats = correction_weights(OLD, ROLLOUT, MASK, INDEX, "tis", level="sequence", threshold=20.0)
    torch.testing.assert_close(weights, torch.full((1, 3), 15.0))
    assert stats["train/is_clipped_frac"] == 0.0
    weights, stats = correction_weights(OLD, ROLLOUT, MASK, INDEX, "tis", level="sequence", threshold=2.0)
    torch.testing.assert_close(weights, torch.full((1, 3), 2.0))
    assert stats["train/is_clipped_frac"] == pytest.approx(3.0)


# Two packed sequences: A's tokens have rho = 1.5 and 1.2 (product 1.8, geometric mean 1.342), B's 1.5 and 1.5
# (product 2.25, geometric mean 1.5), then one padding token.
PACKED_OLD = torch.tensor([[LOG(0.6), LOG(0.6), LOG(0.6), LOG(0.6), 0.0]])
PACKED_ROLLOUT = torch.tensor([[LOG(0.4), LOG(0.5), LOG(0.4), LOG(0.4), 0.0]])
PACKED_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
PACKED_INDEX = torch.tensor([[0, 0, 1, 1, -1]])


def packed_weights(kind: str, level: str, mis_weight: str = "importance", threshold: float = 2.0) -> torch.Tensor:
    args = (PACKED_OLD, PACKED_ROLLOUT, PACKED_MASK, PACKED_INDEX, kind, level, threshold)
    return correction_weights(*args, mis_weight=mis_weight)[0]


def test_sequence_level_tis_in_packed_rows():
    torch.testing.assert_close(packed_weights("tis", "sequence"), torch.tensor([[1.8, 1.8, 2.0, 2.0, 0.0]]))


def test_mis_keeps_the_importance_weight_of_the_tokens_it_keeps_or_one_when_asked():
    # band [0.5, 2]: rho 5 and 3 dropped, rho 1 kept with its weight 1
    weights, stats = correction_weights(OLD, ROLLOUT, MASK, INDEX, "mis", threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 0.0]]))
    assert stats["train/is_clipped_frac"] == pytest.approx(2.0)
    # rho 1.5, 1.2, 1.5, 1.5 all inside the band: IcePop's MIS keeps each token's rho (min(rho, C) = rho in the band)
    torch.testing.assert_close(packed_weights("mis", "token"), torch.tensor([[1.5, 1.2, 1.5, 1.5, 0.0]]))
    torch.testing.assert_close(packed_weights("mis", "token", "one"), torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]]))
    # a band that drops rho = 1.2: [1.3, 2]
    weights, _ = correction_weights(*(PACKED_OLD, PACKED_ROLLOUT, PACKED_MASK, PACKED_INDEX), "mis", "token", 2.0, 1.3)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 0.0, 1.5, 1.5, 0.0]]))


def test_sequence_mis_keeps_or_drops_sequences_by_their_product_and_keeps_its_weight():
    # Seq-MIS (Liu, Li et al. 2025): A's rho = 1.8 in [0.5, 2], kept with weight 1.8; B's 2.25 > 2, dropped
    torch.testing.assert_close(packed_weights("mis", "sequence"), torch.tensor([[1.8, 1.8, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(packed_weights("mis", "sequence", "one"), torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]]))


def test_geometric_mis_drops_sequences_by_their_geometric_mean_and_keeps_their_truncated_weight():
    # geometric means 1.342 and 1.5, both in [0.5, 2]: both kept, weighing min(1.8, 2) and min(2.25, 2)
    torch.testing.assert_close(packed_weights("mis", "geometric"), torch.tensor([[1.8, 1.8, 2.0, 2.0, 0.0]]))
    torch.testing.assert_close(packed_weights("mis", "geometric", "one"), torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]]))
    # C = 1.4 drops B (1.5 > 1.4) and keeps A (1.342), whose weight is truncated at C: min(1.8, 1.4)
    torch.testing.assert_close(
        packed_weights("mis", "geometric", threshold=1.4), torch.tensor([[1.4, 1.4, 0.0, 0.0, 0.0]])
    )
    # the single sequence above: geometric mean (5 * 1 * 3) ** (1/3) = 2.47 > 2: dropped; with C = 3 kept at min(15, 3)
    weights, _ = correction_weights(OLD, ROLLOUT, MASK, INDEX, "mis", level="geometric", threshold=2.0)
    torch.testing.assert_close(weights, torch.zeros(1, 3))
    weights, _ = correction_weights(OLD, ROLLOUT, MASK, INDEX, "mis", level="geometric", threshold=3.0)
    torch.testing.assert_close(weights, torch.full((1, 3), 3.0))


def test_a_geometric_mean_is_refused_as_an_importance_weight():
    with pytest.raises(ValueError, match="rejection statistic"):
        packed_weights("tis", "geometric")
    with pytest.raises(ValueError, match=r"model\.correction\.level to sequence"):
        Correction(kind="tis", level="geometric")
    with pytest.raises(ValueError, match=r"model\.correction\.mis_weight must be one of \['importance', 'one'\]"):
        Correction(kind="mis", mis_weight="ones")  # type: ignore[arg-type]


def test_gspo_needs_its_mean_over_sequences():
    with pytest.raises(
        ValueError, match=r"policy_ratio: sequence is GSPO.*model\.loss\.aggregation: seq-mean-token-mean"
    ):
        Loss(policy_ratio="sequence")
    Loss(policy_ratio="sequence", aggregation="seq-mean-token-mean")


def test_gspo_loss_is_the_mean_over_sequences_of_the_clipped_sequence_objective():
    # GSPO (Zheng et al. 2025): J = 1/G sum_i min(s_i A_i, clip(s_i) A_i), s_i the geometric-mean ratio. Sequence 0
    # (3 tokens, s = 1, A = 1) and sequence 1 (1 token, r = 1.1, A = -1): J = (1 + -1.1) / 2 = -0.05, loss 0.05.
    # A token mean would weigh sequence 0 three times: -(3 * 1 - 1.1) / 4 = -0.475.
    new = torch.tensor([[LOG(0.5), LOG(0.5), LOG(0.5), LOG(0.55)]])
    old = torch.tensor([[LOG(0.5), LOG(0.5), LOG(0.5), LOG(0.5)]])
    index = torch.tensor([[0, 0, 0, 1]])
    settings = Loss(policy_ratio="sequence", aggregation="seq-mean-token-mean")
    loss, _ = clipped_policy_loss(
        new, old, torch.tensor([[1.0, 1.0, 1.0, -1.0]]), torch.ones(1, 4), aggregation=settings.aggregation,
        sequence_index=index, sequence_ratio=True,
    )  # fmt: skip
    assert float(loss) == pytest.approx(0.05)


def test_rollout_correction_needs_the_trainers_old_logprobs():
    from lit_agentrl.training.module import GRPOModule

    with pytest.raises(ValueError, match=r"needs model\.loss\.old_logprobs: trainer"):
        GRPOModule("unused", correction=Correction(kind="tis"))
    with pytest.raises(ValueError, match=r"model\.loss\.old_logprobs must be one of"):
        Loss(old_logprobs="reference")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"model\.loss\.clip_ratio_c"):
        Loss(clip_ratio_c=0.5)


def trajectory(agent: str, logprobs: list[float] | None) -> Trajectory:
    return Trajectory(0, 0, agent, [1, 2], [1, 2, 3, 4], [0, 0, 1, 1], logprobs, reward=1.0)


def test_missing_engine_logprobs_are_an_error_naming_the_agent_not_zeros():
    with pytest.raises(ValueError, match=r"agent\(s\) \['my_agent'\] returned trajectories without response_logprobs"):
        prepare_samples([trajectory("my_agent", None), trajectory("other", [-0.1, -0.2])])
    (sample,) = prepare_samples([trajectory("my_agent", None)], need_rollout_logprobs=False).samples
    assert sample.rollout_logprobs is None  # the trainer fills old_logprobs
    (sample,) = prepare_samples([trajectory("a", [-0.1, -0.2])]).samples
    assert sample.old_logprobs == sample.rollout_logprobs == [0.0, -0.1, -0.2]


def test_the_trainers_old_logprobs_make_the_first_update_exactly_on_policy(tiny_model_dir):
    from lit_agentrl.training.module import GRPOModule

    module = GRPOModule(str(tiny_model_dir), loss=Loss(old_logprobs="trainer"), compute=Compute(micro_batch_tokens=32))
    module.configure_model()
    g = torch.Generator().manual_seed(0)
    samples = []
    for length in (9, 14, 6, 20):
        ids = torch.randint(3, module.policy.config.vocab_size, (length + 1,), generator=g).tolist()
        mask = [0] * 3 + [1] * (length - 3)
        samples.append(TrainingSample(ids[:-1], ids[1:], mask, [-9.0] * length, advantage=float(length % 3 - 1)))
    module.recompute_old_logprobs(samples)
    assert all(-9.0 not in s.old_logprobs for s in samples)
    stats = module.accumulate_gradients(samples)
    assert stats["train/ratio_mean"] == 1.0 and stats["train/approx_kl"] == 0.0 and stats["train/clip_frac"] == 0.0


def test_one_mini_batch_takes_the_old_logprobs_from_its_own_forward_exactly_as_recomputing_them(tiny_model_dir):
    from lit_agentrl.training.module import GRPOModule

    g = torch.Generator().manual_seed(1)
    samples = []
    for length in (9, 14, 6, 20):
        ids = torch.randint(3, 64, (length + 1,), generator=g).tolist()
        samples.append(
            TrainingSample(ids[:-1], ids[1:], [0] * 3 + [1] * (length - 3), [-9.0] * length, 1.0 - length % 3)
        )

    def gradients(module: GRPOModule, recompute: bool) -> tuple[dict[str, float], list[torch.Tensor]]:
        batch = [dataclasses.replace(s) for s in samples]
        if recompute:
            module.recompute_old_logprobs(batch)
        module.policy.zero_grad(set_to_none=True)
        stats = module.accumulate_gradients(batch)
        return stats, [p.grad.clone() for p in module.policy.parameters()]

    one = GRPOModule(str(tiny_model_dir), loss=Loss(old_logprobs="trainer"), compute=Compute(micro_batch_tokens=32))
    one.configure_model()
    assert one.old_logprobs_from_update
    # the stale -9.0 in the samples is never read: the update's forward supplies pi_old
    reused_stats, reused = gradients(one, recompute=False)
    assert reused_stats["train/ratio_mean"] == 1.0 and reused_stats["train/clip_frac"] == 0.0
    _, recomputed = gradients(one, recompute=True)
    for a, b in zip(reused, recomputed):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # two mini-batches: the second update's pi_old is the policy before the first, so it must be recomputed
    two = GRPOModule(
        str(tiny_model_dir),
        Optimizer(mini_batches=2),
        Loss(old_logprobs="trainer"),
        compute=Compute(micro_batch_tokens=32),
    )
    two.configure_model()
    assert not two.old_logprobs_from_update
    assert gradients(two, recompute=False)[0]["train/clip_frac"] > 0.0  # the samples' own -9.0 is the ratio's base
    assert not GRPOModule(str(tiny_model_dir)).old_logprobs_from_update  # engine log-probs: nothing to reuse


def finished(group: int, reward: float, generated: int, cut: bool) -> Trajectory:
    t = Trajectory(group, 0, "a", [1, 2], [1, 2] + [3] * generated, [0, 0] + [1] * generated, [-0.5] * generated)
    t.reward = reward
    t.extra_fields["finish_reason"] = {"type": "length", "length": generated} if cut else {"type": "stop", "matched": 2}
    return t


def test_dapo_soft_overlong_penalty_falls_linearly_over_the_buffer():
    overlong = Overlong("penalty", max_length=20, buffer=4, penalty_factor=0.5)
    # up to 16 tokens nothing; then -0.5 * (L - 16) / 4; the limit and beyond: -0.5
    assert [overlong.penalty(n) for n in (10, 16, 17, 18, 20, 25)] == [0.0, 0.0, -0.125, -0.25, -0.5, -0.5]
    # rewards 1 and 1 become 1 and 0.75 (18 tokens): one group, mean 0.875, Dr. GRPO advantages +0.125, -0.125
    prepared = prepare_samples([finished(0, 1.0, 10, False), finished(0, 1.0, 18, True)], "none", True, overlong)
    assert [s.advantage for s in prepared.samples] == pytest.approx([0.125, -0.125])
    with pytest.raises(ValueError, match=r"model\.overlong\.max_length"):
        Overlong("penalty")


def test_a_multi_turn_overlong_penalty_counts_the_models_tokens_over_all_turns_and_no_others():
    # DAPO: R_length(y) = ((L_max - L_cache) - |y|) / L_cache for L_max - L_cache < |y| <= L_max, y the policy's
    # response. Here the policy wrote 3 tokens, a tool answered with 4, the policy wrote 2 more: |y| = 5, not 9 and
    # not the last turn's 2. L_max = 6, L_cache = 2: (4 - 5) / 2 = -0.5 (times the factor, 1).
    t = Trajectory(0, 0, "a", [1, 2], [1, 2, 3, 3, 3, 7, 7, 7, 7, 3, 3], [0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1])
    t.response_logprobs, t.reward = [-0.5] * 9, 1.0
    overlong = Overlong("penalty", max_length=6, buffer=2)
    assert overlong.penalty(t.num_generated_tokens) == pytest.approx(-0.5)
    other = Trajectory(0, 1, "a", [1, 2], [1, 2, 3], [0, 0, 1], [-0.5], reward=1.0)  # |y| = 1: no penalty
    prepared = prepare_samples([t, other], "none", True, overlong)
    assert [s.advantage for s in prepared.samples] == pytest.approx([-0.25, 0.25])  # rewards 0.5 and 1, mean 0.75


def test_masked_truncated_trajectories_count_in_advantages_but_carry_no_loss():
    trajectories = [finished(0, 1.0, 5, False), finished(0, 0.0, 9, True), finished(0, 0.0, 4, False)]
    kept = prepare_samples(trajectories, "none", True, Overlong("keep")).samples
    masked = prepare_samples(trajectories, "none", True, Overlong("mask")).samples
    assert len(kept) == 3 and len(masked) == 2  # the truncated one is out of the loss and of its counts
    assert [s.advantage for s in masked] == pytest.approx([2 / 3, -1 / 3])  # group mean 1/3, with it
    assert [t.truncated for t in trajectories] == [False, True, False]


def test_the_truncated_fraction_is_logged():
    from lit_agentrl.rollout.metrics import RolloutMetrics

    trajectories = [finished(0, 1.0, 5, False), finished(0, 0.0, 9, True), finished(0, 0.0, 4, False)]
    assert RolloutMetrics().compute(trajectories, seconds=1.0)["rollout/truncated_frac"] == pytest.approx(1 / 3)
