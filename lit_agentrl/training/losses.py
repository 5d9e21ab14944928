"""GRPO maths as pure functions: advantages, token log-probs, the clipped policy loss, KL. Each returns stats.

Shapes in comments: N trajectories in a rollout batch, B sequences in a micro-batch, L tokens, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from lit_agentrl.config.choices import ADVANTAGE_STDS


class GroupAdvantages(NamedTuple):
    advantages: torch.Tensor  # [N]
    num_groups: int
    num_flat_groups: int  # groups whose rewards are all equal: zero advantage, no gradient


def grpo_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, std: str = "sample", eps: float = 1e-6
) -> GroupAdvantages:
    """Group-relative advantages: each reward minus its group's mean, over the group's std plus ``eps``.

    rewards: [N] float; groups: [N] int (trajectories of one prompt share a group id). ``std`` is one of
    :data:`ADVANTAGE_STDS`. A group of one trajectory has zero advantage (and counts as flat) whatever ``std`` is.
    """
    if std not in ADVANTAGE_STDS:
        raise ValueError(f"model.advantage_std must be one of {list(ADVANTAGE_STDS)}, got {std!r}")
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    sums = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, rewards)
    means = sums / counts
    centered = rewards - means[inverse]
    squares = torch.zeros_like(sums).index_add_(0, inverse, centered**2)
    degrees = (counts - 1).clamp(min=1) if std == "sample" else counts  # Bessel's n - 1 (a group of one: 0 / 1)
    stds = (squares / degrees).sqrt()
    advantages = centered if std == "none" else centered / (stds[inverse] + eps)
    return GroupAdvantages(advantages, num_groups, int((stds <= eps).sum()))


class TokenLogProbs(NamedTuple):
    logprobs: torch.Tensor  # [B, L]
    entropy: torch.Tensor | None  # [B, L]


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> TokenLogProbs:
    """Log-probability of each target token under softmax(logits / temperature), and optionally the entropy.

    logits: [B, L, V] (position t predicts targets[:, t]); targets: [B, L]. Computed in float32. With
    ``entropy_grad=False`` the entropy is computed without a graph (reported, not optimised), sharing the
    log-normaliser of the log-probs instead of recomputing it.
    """
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    log_z = torch.logsumexp(scaled, dim=-1)  # [B, L]
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            s, z = (scaled, log_z) if entropy_grad else (scaled.detach(), log_z.detach())
            entropy = z - (torch.exp(s - z.unsqueeze(-1)) * s).sum(-1)
    return TokenLogProbs(picked, entropy)


class PolicyLossStats(NamedTuple):
    clip_frac: torch.Tensor  # fraction of masked tokens whose ratio was clipped
    ratio_mean: torch.Tensor
    approx_kl: torch.Tensor  # mean of (old - new) log-prob: how far the policy moved from the rollout


class LossScale(NamedTuple):
    """Counts of the whole mini-batch a micro-batch belongs to. Dividing by these instead of the micro-batch's own
    counts makes the micro-batches' losses add up to the mini-batch's loss, however the samples were split.
    ``norm_length`` is Dr. GRPO's constant per-sequence normaliser (``seq-mean-token-sum-norm``)."""

    tokens: float
    sequences: float
    norm_length: float = 1.0


Aggregation = Callable[[torch.Tensor, torch.Tensor, LossScale | None, torch.Tensor | None], torch.Tensor]
"""(values [B, L], float mask [B, L], scale, sequence_index [B, L] or None) -> scalar."""


def token_mean(
    values: torch.Tensor, mask: torch.Tensor, scale: LossScale | None, sequence_index: torch.Tensor | None
) -> torch.Tensor:
    """Sum over every trained token / the number of trained tokens."""
    return (values * mask).sum() / (scale.tokens if scale is not None else mask.sum().clamp(min=1))


def seq_mean_token_mean(
    values: torch.Tensor, mask: torch.Tensor, scale: LossScale | None, sequence_index: torch.Tensor | None
) -> torch.Tensor:
    """Mean over each sequence's tokens, then mean over sequences."""
    sums, tokens = per_sequence_sums(values * mask, mask, sequence_index)
    return _over_sequences(sums / tokens.clamp(min=1), scale)


def seq_mean_token_sum(
    values: torch.Tensor, mask: torch.Tensor, scale: LossScale | None, sequence_index: torch.Tensor | None
) -> torch.Tensor:
    """Sum over each sequence's tokens, then mean over sequences."""
    sums, _ = per_sequence_sums(values * mask, mask, sequence_index)
    return _over_sequences(sums, scale)


def seq_mean_token_sum_norm(
    values: torch.Tensor, mask: torch.Tensor, scale: LossScale | None, sequence_index: torch.Tensor | None
) -> torch.Tensor:
    """Dr. GRPO: sum over each sequence's tokens divided by a constant length (``model.loss_norm_length``), then mean
    over sequences, so a sequence's tokens weigh the same however long it is."""
    sums, _ = per_sequence_sums(values * mask, mask, sequence_index)
    return _over_sequences(sums, scale) / (scale.norm_length if scale is not None else 1.0)


AGGREGATIONS: dict[str, Aggregation] = {  # keyed by config.choices.AGGREGATIONS
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}
"""``model.loss.aggregation`` names -> functions: a new aggregation is one function, its entry here and its name in
``lit_agentrl.config.choices.AGGREGATIONS``."""


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    how: str,
    scale: LossScale | None = None,
    sequence_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` [B, L] under ``mask`` [B, L] with the aggregation named ``how``.

    ``scale`` (the whole mini-batch's counts) replaces this batch's own token or sequence count. A sequence is
    a row, or, for packed rows, the tokens sharing a ``sequence_index`` [B, L] (-1: padding).
    """
    try:
        reduce = AGGREGATIONS[how]
    except KeyError:
        raise ValueError(f"unknown loss aggregation {how!r}; use one of {', '.join(AGGREGATIONS)}") from None
    return reduce(values, mask.to(values.dtype), scale, sequence_index)


def _over_sequences(per_sequence: torch.Tensor, scale: LossScale | None) -> torch.Tensor:
    return per_sequence.sum() / (scale.sequences if scale is not None else max(per_sequence.numel(), 1))


def per_sequence_sums(
    masked: torch.Tensor, mask: torch.Tensor, sequence_index: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums of ``masked`` and of ``mask`` per sequence: per row, or per ``sequence_index``."""
    if sequence_index is None:
        return masked.sum(-1), mask.sum(-1)
    real = sequence_index >= 0
    index = sequence_index[real]
    count = int(index.max()) + 1 if index.numel() else 0
    sums = masked.new_zeros(count).index_add(0, index, masked[real])
    return sums, mask.new_zeros(count).index_add(0, index, mask[real])


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: str = "token-mean",
    scale: LossScale | None = None,
    sequence_index: torch.Tensor | None = None,
    *,
    clip_ratio_c: float | None = None,
    sequence_ratio: bool = False,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """PPO/GRPO clipped surrogate with separate low/high clip ratios (DAPO's clip-higher when high > low).

    logprobs, old_logprobs, mask: [B, L]; advantages: [B] (one per row, broadcast over its tokens) or [B, L]
    (per token, for packed rows; see :func:`aggregate` for ``sequence_index``).
    loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A), aggregated under ``mask``.

    ``clip_ratio_c`` (> 1): dual-clip, the loss of a token with A < 0 is at most -c A however large r grows.
    ``sequence_ratio``: GSPO, every token of a sequence takes the sequence's ratio exp(mean of its tokens' log
    ratios), clipped as one, with the gradient of r times the mean log-prob. ``weights`` [B, L] (no gradient)
    multiply each token's loss: the rollout correction's importance weights (0 drops a token).
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    if sequence_ratio:
        per_token = sequence_index if sequence_index is not None else _row_index(mask)
        sums, counts = per_sequence_sums(log_ratio * mask, mask.to(log_ratio.dtype), per_token)
        sequence_log_ratio = (sums / counts.clamp(min=1)).detach()[per_token.clamp(min=0)]
        log_ratio = sequence_log_ratio + logprobs - logprobs.detach()  # value: the sequence's; gradient: r d logp
    ratio = log_ratio.exp()
    adv = (advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)).to(logprobs.dtype)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if clip_ratio_c is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -clip_ratio_c * adv), per_token)
    if weights is not None:
        per_token = per_token * weights.detach()
    loss = aggregate(per_token, mask, aggregation, scale, sequence_index)
    with torch.no_grad():
        m = mask.to(logprobs.dtype)
        n = m.sum().clamp(min=1)
        stats = PolicyLossStats(
            clip_frac=((clipped < unclipped).to(m.dtype) * m).sum() / n,
            ratio_mean=(ratio * m).sum() / n,
            approx_kl=(-log_ratio * m).sum() / n,
        )
    return loss, stats


def _row_index(mask: torch.Tensor) -> torch.Tensor:
    """Each row one sequence: [B, L] of row numbers."""
    return torch.arange(mask.shape[0], device=mask.device).unsqueeze(-1).expand_as(mask)


def kl_to_reference(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(ref - pi) - (ref - pi) - 1, always >= 0. [B, L]."""
    delta = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return delta.exp() - delta - 1.0
