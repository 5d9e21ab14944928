"""The GRPO objective: its settings, validated once, and the loss of one micro-batch from its logits.

:class:`Objective` holds what shapes the loss (clip range, KL and entropy weights, aggregation, temperature);
:func:`micro_batch_loss` turns a micro-batch's token log-probs and entropy (and the reference model's log-probs)
into the loss and its statistics. ``GRPOModule`` computes those (:mod:`lit_agentrl.logprobs`) and calls it for
every micro-batch; tests call it without a Trainer.

A new variant is one function plus one config value: a loss aggregation is a function registered in
:data:`lit_agentrl.losses.AGGREGATIONS` and named by ``model.loss_aggregation``; a new term is a field here
and a few lines in :func:`micro_batch_loss`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lit_agentrl.batching import MicroBatch, TrainingSample
from lit_agentrl.correction import CORRECTIONS, LEVELS, MIS_WEIGHTS, correction_weights
from lit_agentrl.losses import AGGREGATIONS, LossScale, TokenLogProbs, aggregate, clipped_policy_loss, kl_to_reference

OLD_LOGPROBS = ("engine", "trainer")
POLICY_RATIOS = ("token", "sequence")


@dataclass(frozen=True)
class Objective:
    """Settings of the GRPO loss. Field names are the ``model.*`` config keys (``temperature`` is
    ``model.rollout_temperature``); every value is checked here, so a bad one fails when the module is built.

    Args:
        clip_ratio_low: PPO clip below (ratio >= 1 - low).
        clip_ratio_high: PPO clip above (ratio <= 1 + high); > low is DAPO's clip-higher.
        kl_coef: weight of the k3 KL to a frozen reference policy (0: no reference).
        entropy_coef: weight of an entropy bonus (0: entropy is reported, not optimised).
        loss_aggregation: a name in :data:`~lit_agentrl.losses.AGGREGATIONS`.
        temperature: the sampling temperature; log-probs are computed at it.
        old_logprobs: the PPO ratio's denominator: ``engine`` (the rollout's own log-probs) or ``trainer`` (the
            policy's, recomputed before the update with the same micro-batching).
        rollout_correction: None, ``tis`` or ``mis``: importance weights between the engine and the trainer
            (:mod:`lit_agentrl.correction`); needs ``old_logprobs: trainer``.
        rollout_correction_level: ``token``, ``sequence`` (the product of the sequence's token ratios) or
            ``geometric`` (``mis`` only: sequences dropped by their geometric-mean ratio).
        rollout_is_threshold: C, where ``tis`` truncates and the top of ``mis``'s band.
        rollout_is_threshold_low: the bottom of ``mis``'s band (None: 1 / C).
        rollout_mis_weight: what ``mis`` leaves on the tokens it keeps: ``importance`` (their truncated importance
            weight, the published masked importance sampling) or ``one`` (pure rejection sampling).
        policy_ratio: ``token`` (PPO/GRPO) or ``sequence`` (GSPO: one ratio per sequence, the geometric mean), which
            needs ``loss_aggregation: seq-mean-token-mean``, GSPO's mean over sequences.
        clip_ratio_c: dual-clip's c (> 1) for negative advantages; None: off.
        loss_norm_length: Dr. GRPO's constant normaliser, needed by ``seq-mean-token-sum-norm``.
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    loss_aggregation: str = "token-mean"
    temperature: float = 1.0
    old_logprobs: str = "engine"
    rollout_correction: str | None = None
    rollout_correction_level: str = "token"
    rollout_is_threshold: float = 2.0
    rollout_is_threshold_low: float | None = None
    rollout_mis_weight: str = "importance"
    policy_ratio: str = "token"
    clip_ratio_c: float | None = None
    loss_norm_length: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (0 <= self.clip_ratio_low < 1, f"model.clip_ratio_low must be in [0, 1), got {self.clip_ratio_low}"),
            (self.clip_ratio_high >= 0, f"model.clip_ratio_high must be >= 0, got {self.clip_ratio_high}"),
            (self.kl_coef >= 0, f"model.kl_coef must be >= 0, got {self.kl_coef}"),
            (self.entropy_coef >= 0, f"model.entropy_coef must be >= 0, got {self.entropy_coef}"),
            (
                self.loss_aggregation in AGGREGATIONS,
                f"model.loss_aggregation {self.loss_aggregation!r} is not one of {', '.join(AGGREGATIONS)}",
            ),
            (
                self.temperature > 0,
                f"model.rollout_temperature must be > 0 (training needs sampled rollouts), got {self.temperature}",
            ),
            (
                self.old_logprobs in OLD_LOGPROBS,
                f"model.old_logprobs must be one of {list(OLD_LOGPROBS)}, got {self.old_logprobs!r}",
            ),
            (
                self.rollout_correction in (None, *CORRECTIONS),
                f"model.rollout_correction must be null or one of {list(CORRECTIONS)}, got {self.rollout_correction!r}",
            ),
            (
                self.rollout_correction is None or self.old_logprobs == "trainer",
                "model.rollout_correction corrects the trainer's old log-probs towards the engine's: it needs "
                "model.old_logprobs: trainer",
            ),
            (
                self.rollout_correction_level in LEVELS,
                f"model.rollout_correction_level must be one of {list(LEVELS)}, got {self.rollout_correction_level!r}",
            ),
            (self.rollout_is_threshold > 0, f"model.rollout_is_threshold must be > 0, got {self.rollout_is_threshold}"),
            (
                self.rollout_is_threshold_low is None or 0 <= self.rollout_is_threshold_low < self.rollout_is_threshold,
                "model.rollout_is_threshold_low must be in [0, model.rollout_is_threshold), got "
                f"{self.rollout_is_threshold_low}",
            ),
            (
                self.rollout_correction != "tis" or self.rollout_correction_level != "geometric",
                "model.rollout_correction: tis weighs tokens by an importance weight, and a geometric-mean ratio is "
                "not one: set model.rollout_correction_level to sequence (the product of the token ratios) or token, "
                "or model.rollout_correction: mis to drop sequences by their geometric mean",
            ),
            (
                self.rollout_mis_weight in MIS_WEIGHTS,
                f"model.rollout_mis_weight must be one of {list(MIS_WEIGHTS)}, got {self.rollout_mis_weight!r}",
            ),
            (
                self.policy_ratio in POLICY_RATIOS,
                f"model.policy_ratio must be one of {list(POLICY_RATIOS)}, got {self.policy_ratio!r}",
            ),
            (
                self.policy_ratio != "sequence" or self.loss_aggregation == "seq-mean-token-mean",
                "model.policy_ratio: sequence is GSPO, whose objective is a mean over sequences: set "
                "model.loss_aggregation: seq-mean-token-mean (got "
                f"{self.loss_aggregation!r}, which weighs a sequence by its length)",
            ),
            (
                self.clip_ratio_c is None or self.clip_ratio_c > 1,
                f"model.clip_ratio_c (dual-clip) must be > 1 or null, got {self.clip_ratio_c}",
            ),
            (
                self.loss_aggregation != "seq-mean-token-sum-norm" or (self.loss_norm_length or 0) > 0,
                "model.loss_aggregation seq-mean-token-sum-norm divides by a constant length: set "
                f"model.loss_norm_length (e.g. the max_new_tokens of sampling), got {self.loss_norm_length}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def needs_reference(self) -> bool:
        """Whether the loss needs the reference model's logits."""
        return self.kl_coef > 0

    @property
    def norm_length(self) -> float:
        """Dr. GRPO's constant length (1 for every other aggregation)."""
        return float(self.loss_norm_length or 1)


def loss_scale(samples: Sequence[TrainingSample], norm_length: float = 1.0) -> LossScale:
    """The mini-batch's token and sequence counts, which every micro-batch's loss is divided by."""
    tokens = float(sum(sum(s.loss_mask) for s in samples))
    return LossScale(tokens=max(tokens, 1.0), sequences=max(float(len(samples)), 1.0), norm_length=norm_length)


def micro_batch_loss(
    objective: Objective,
    micro: MicroBatch,
    policy: TokenLogProbs,
    scale: LossScale,
    reference_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch, scaled so that a mini-batch's micro-batch losses add up to its loss.

    policy: the policy's log-probs and entropy of ``micro``'s targets, [R, W] each, computed at
    ``objective.temperature`` (with a graph on the entropy when ``entropy_coef > 0``); reference_logprobs: the
    reference model's, [R, W]. Statistics are sums over the micro-batch's trained tokens (``train/entropy``,
    ``train/clip_frac``, ...), to be divided by the mini-batch's token count, except ``train/loss``, which is this
    micro-batch's share of the mini-batch's loss.
    """
    mask, index, how = micro.loss_mask, micro.sequence_index, objective.loss_aggregation
    logprobs, entropy = policy
    if entropy is None:
        raise ValueError("micro_batch_loss needs the policy's entropy (token_logprobs(..., with_entropy=True))")
    weights: torch.Tensor | None = None
    stats: dict[str, float] = {}
    if objective.rollout_correction is not None:
        weights, stats = correction_weights(
            micro.old_logprobs,
            micro.rollout_logprobs,
            mask,
            index,
            objective.rollout_correction,
            objective.rollout_correction_level,
            objective.rollout_is_threshold,
            objective.rollout_is_threshold_low,
            objective.rollout_mis_weight,
        )
    loss, clip = clipped_policy_loss(
        logprobs,
        micro.old_logprobs,
        micro.advantages,
        mask,
        objective.clip_ratio_low,
        objective.clip_ratio_high,
        how,
        scale,
        index,
        clip_ratio_c=objective.clip_ratio_c,
        sequence_ratio=objective.policy_ratio == "sequence",
        weights=weights,
    )
    n_tokens = float(mask.sum())
    stats |= {
        "train/entropy": float((entropy.detach() * mask).sum()),
        "train/clip_frac": float(clip.clip_frac) * n_tokens,
        "train/ratio_mean": float(clip.ratio_mean) * n_tokens,
        "train/approx_kl": float(clip.approx_kl) * n_tokens,
    }
    if objective.entropy_coef > 0:
        loss = loss - objective.entropy_coef * aggregate(entropy, mask, how, scale, index)
    if objective.needs_reference:
        if reference_logprobs is None:
            raise ValueError(f"kl_coef={objective.kl_coef} needs the reference model's log-probs")
        kl = kl_to_reference(logprobs, reference_logprobs.detach())
        loss = loss + objective.kl_coef * aggregate(kl, mask, how, scale, index)
        stats["train/kl"] = float((kl.detach() * mask).sum())
    stats["train/loss"] = float(loss.detach())
    return loss, stats
