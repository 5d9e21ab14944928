"""The GRPO objective: the loss of one micro-batch from its log-probs, under the ``model.loss`` and
``model.correction`` settings (:mod:`lit_agentrl.config.training`).

:func:`micro_batch_loss` turns a micro-batch's token log-probs and entropy (and the reference model's log-probs)
into the loss and its statistics. ``GRPOModule`` computes those (:mod:`lit_agentrl.training.logprobs`) and calls it for
every micro-batch; tests call it without a Trainer.

A new variant is one function plus one config value: a loss aggregation is a function registered in
:data:`lit_agentrl.training.losses.AGGREGATIONS` and named by ``model.loss.aggregation``; a new term is a field of
:class:`~lit_agentrl.config.training.Loss` and a few lines in :func:`micro_batch_loss`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lit_agentrl.config.training import Correction, Loss
from lit_agentrl.training.batching import MicroBatch, TrainingSample
from lit_agentrl.training.correction import correction_weights
from lit_agentrl.training.losses import LossScale, TokenLogProbs, aggregate, clipped_policy_loss, kl_to_reference


def loss_scale(samples: Sequence[TrainingSample], norm_length: float = 1.0) -> LossScale:
    """The mini-batch's token and sequence counts, which every micro-batch's loss is divided by."""
    tokens = float(sum(sum(s.loss_mask) for s in samples))
    return LossScale(tokens=max(tokens, 1.0), sequences=max(float(len(samples)), 1.0), norm_length=norm_length)


def micro_batch_loss(
    loss: Loss,
    correction: Correction | None,
    micro: MicroBatch,
    policy: TokenLogProbs,
    scale: LossScale,
    reference_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch, scaled so that a mini-batch's micro-batch losses add up to its loss.

    policy: the policy's log-probs and entropy of ``micro``'s targets, [R, W] each, computed at the sampling
    temperature (with a graph on the entropy when ``entropy_coef > 0``); reference_logprobs: the reference model's,
    [R, W]. Statistics are sums over the micro-batch's trained tokens (``train/entropy``, ``train/clip_frac``, ...),
    to be divided by the mini-batch's token count, except ``train/loss``, which is this micro-batch's share of the
    mini-batch's loss.
    """
    mask, index, how = micro.loss_mask, micro.sequence_index, loss.aggregation
    logprobs, entropy = policy
    if entropy is None:
        raise ValueError("micro_batch_loss needs the policy's entropy (token_logprobs(..., with_entropy=True))")
    weights: torch.Tensor | None = None
    stats: dict[str, float] = {}
    if correction is not None:
        weights, stats = correction_weights(
            micro.old_logprobs,
            micro.rollout_logprobs,
            mask,
            index,
            correction.kind,
            correction.level,
            correction.threshold,
            correction.threshold_low,
            correction.mis_weight,
        )
    value, clip = clipped_policy_loss(
        logprobs,
        micro.old_logprobs,
        micro.advantages,
        mask,
        loss.clip_ratio_low,
        loss.clip_ratio_high,
        how,
        scale,
        index,
        clip_ratio_c=loss.clip_ratio_c,
        sequence_ratio=loss.policy_ratio == "sequence",
        weights=weights,
    )
    n_tokens = float(mask.sum())
    stats |= {
        "train/entropy": float((entropy.detach() * mask).sum()),
        "train/clip_frac": float(clip.clip_frac) * n_tokens,
        "train/ratio_mean": float(clip.ratio_mean) * n_tokens,
        "train/approx_kl": float(clip.approx_kl) * n_tokens,
    }
    if loss.entropy_coef > 0:
        value = value - loss.entropy_coef * aggregate(entropy, mask, how, scale, index)
    if loss.needs_reference:
        if reference_logprobs is None:
            raise ValueError(f"kl_coef={loss.kl_coef} needs the reference model's log-probs")
        kl = kl_to_reference(logprobs, reference_logprobs.detach())
        value = value + loss.kl_coef * aggregate(kl, mask, how, scale, index)
        stats["train/kl"] = float((kl.detach() * mask).sum())
    stats["train/loss"] = float(value.detach())
    return value, stats
