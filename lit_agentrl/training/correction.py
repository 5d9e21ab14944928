"""Rollout correction: importance weights between the engine that sampled the tokens and the trainer's policy.

With ``model.old_logprobs: trainer`` the PPO ratio is taken against the trainer's own log-probs of the rollout
(pi_old), but the tokens were sampled by the engine (mu: another precision, other kernels, older weights), so the
update is off-policy by the importance ratio rho = pi_old / mu (decoupled PPO, Hilton et al. 2021). With C the
threshold (``model.rollout_is_threshold``) and [C_low, C] the band (``model.rollout_is_threshold_low``, default
1 / C):

* ``tis``, truncated importance sampling: every token's loss is multiplied by min(rho, C).
* ``mis``, masked importance sampling (IcePop; "When Speed Kills Stability", Liu, Li et al. 2025): tokens whose
  rho lies outside [C_low, C] get weight 0, the others keep their truncated importance weight min(rho, C)
  (``model.rollout_mis_weight: importance``, the published form) or weight 1 (``one``: pure rejection sampling,
  verl's ``rollout_rs``).

``model.rollout_correction_level`` says what rho is:

* ``token``: each token's own ratio rho_t;
* ``sequence``: the sequence's importance weight, the product of its tokens' ratios exp(sum_t log rho_t) (verl's
  ``rollout_corr_math.md`` §3.3.2), shared by all its tokens; ``mis`` keeps or drops whole sequences by it;
* ``geometric`` (``mis`` only): whole sequences are kept or dropped by their geometric-mean ratio
  exp(mean_t log rho_t), a rejection statistic that does not grow with length (verl's geometric RS, §3.3.3); a
  kept sequence's tokens weigh its truncated sequence weight min(prod_t rho_t, C), or 1. A geometric mean is not an
  importance weight, so ``tis`` refuses this level.

Sums of log-ratios are clamped to [-20, 20] before exp, as verl does, so weights stay finite. The weights carry no
gradient.
"""

from __future__ import annotations

import torch

from lit_agentrl.config.choices import CORRECTIONS, LEVELS, MIS_WEIGHTS
from lit_agentrl.training.losses import per_sequence_sums

LOG_RATIO_BOUND = 20.0


def correction_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    sequence_index: torch.Tensor,
    kind: str,
    level: str = "token",
    threshold: float = 2.0,
    threshold_low: float | None = None,
    mis_weight: str = "importance",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights [R, W] of the trained tokens, and statistics: sums over the trained tokens (divided by
    their count later) and ``train/mismatch_ratio_max``, a max.

    old_logprobs: the trainer's (pi_old); rollout_logprobs: the engine's (mu); both [R, W]; sequence_index [R, W]
    names each token's sequence (-1: padding). ``threshold`` is C, ``threshold_low`` the bottom of ``mis``'s band
    (default 1 / C), ``mis_weight`` what ``mis`` keeps on the tokens it does not drop.
    """
    _check(kind, level, mis_weight)
    with torch.no_grad():
        m = mask.to(torch.float32)
        log_rho = (old_logprobs - rollout_logprobs).float().clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND) * m
        token_rho = log_rho.exp()
        if level == "token":
            rho, statistic = token_rho, token_rho
        else:
            sums, counts = per_sequence_sums(log_rho, m, sequence_index)
            owner = sequence_index.clamp(min=0)
            rho = sums.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()[owner] * m
            statistic = (sums / counts.clamp(min=1)).exp()[owner] * m if level == "geometric" else rho
        truncated = rho.clamp(max=threshold)
        if kind == "tis":
            weights, corrected = truncated, rho > threshold
        else:
            low = threshold_low if threshold_low is not None else 1.0 / threshold
            kept = (statistic >= low) & (statistic <= threshold)
            weights = torch.where(kept, truncated if mis_weight == "importance" else torch.ones_like(rho), 0.0)
            corrected = ~kept
        stats = {
            "train/mismatch_kl": float((mismatch_kl(old_logprobs, rollout_logprobs) * m.double()).sum()),
            "train/is_weight_mean": float((weights * m).sum()),
            "train/is_clipped_frac": float((corrected.to(m.dtype) * m).sum()),
            "train/mismatch_ratio_max": float((token_rho * m).max()) if m.any() else 1.0,
        }
    return weights * m, stats


def mismatch_kl(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(mu || pi_old) from tokens sampled by the engine (mu): rho - 1 - log rho with
    rho = pi_old / mu, >= 0, whose mean under mu is the KL (Schulman's k3; verl's ``rollout_corr_math.md`` §4.1).

    In float64: for log rho ~ 1e-7 (an fp32 engine against an fp32 trainer) the true value, ~(log rho)^2 / 2, is
    ~1e-14, and float32's exp(x) - 1 - x would return rounding of ~1e-8 instead."""
    log_rho = (old_logprobs.double() - rollout_logprobs.double()).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return (log_rho.exp() - 1.0 - log_rho).clamp(min=0.0)  # clamped: rounding can still dip below 0


def _check(kind: str, level: str, mis_weight: str) -> None:
    if kind not in CORRECTIONS or level not in LEVELS or mis_weight not in MIS_WEIGHTS:
        raise ValueError(
            f"rollout correction {kind!r} at level {level!r} with weight {mis_weight!r}: use one of {CORRECTIONS}, "
            f"{LEVELS} and {MIS_WEIGHTS}"
        )
    if kind == "tis" and level == "geometric":
        raise ValueError("tis needs an importance weight; a geometric-mean ratio is a rejection statistic (mis only)")
