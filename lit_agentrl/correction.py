"""Rollout correction: importance weights between the engine that sampled the tokens and the trainer's policy.

With ``model.old_logprobs: trainer`` the PPO ratio is taken against the trainer's own log-probs of the rollout
(pi_old), but the tokens were sampled by the engine (mu: another precision, other kernels), so the update is
off-policy by w = pi_old / mu. Two corrections, as verl and slime offer them:

* ``tis`` (truncated importance sampling): every token's loss is multiplied by min(w, C);
* ``mis`` (masked importance sampling): tokens whose w lies outside [C_low, C] get weight 0, the others 1.

At ``level: sequence`` a sequence's weight is that of its geometric-mean ratio exp(mean log w), shared by all
its tokens (``mis`` then drops or keeps whole sequences). The weights carry no gradient.
"""

from __future__ import annotations

import torch

from lit_agentrl.losses import per_sequence_sums

CORRECTIONS = ("tis", "mis")
LEVELS = ("token", "sequence")


def correction_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    sequence_index: torch.Tensor,
    kind: str,
    level: str = "token",
    threshold: float = 2.0,
    threshold_low: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights [R, W] of the trained tokens, and statistics: sums over the trained tokens (divided by
    their count later) and ``train/mismatch_ratio_max``, a max.

    old_logprobs: the trainer's (pi_old); rollout_logprobs: the engine's (mu); both [R, W]. ``threshold`` is C
    (``model.rollout_is_threshold``), ``threshold_low`` the lower edge of ``mis``'s band (default 1 / C).
    """
    if kind not in CORRECTIONS or level not in LEVELS:
        raise ValueError(f"rollout correction {kind!r} at level {level!r}: use one of {CORRECTIONS} and {LEVELS}")
    with torch.no_grad():
        m = mask.to(torch.float32)
        log_w = (old_logprobs - rollout_logprobs).float().clamp(-20.0, 20.0) * m
        token_w = log_w.exp()
        if level == "sequence":
            sums, counts = per_sequence_sums(log_w, m, sequence_index)
            log_w = (sums / counts.clamp(min=1))[sequence_index.clamp(min=0)] * m
        w = log_w.exp()
        low = threshold_low if threshold_low is not None else 1.0 / threshold
        if kind == "tis":
            weights, corrected = w.clamp(max=threshold), w > threshold
        else:
            kept = (w >= low) & (w <= threshold)
            weights, corrected = kept.to(w.dtype), ~kept
        delta = (rollout_logprobs - old_logprobs).float().clamp(-20.0, 20.0)  # log mu - log pi_old
        stats = {
            # k3 of KL(pi_old || mu), >= 0 (clamped: for tiny d its float rounding can dip below)
            "train/mismatch_kl": float(((delta.exp() - delta - 1.0).clamp(min=0.0) * m).sum()),
            "train/is_weight_mean": float((weights * m).sum()),
            "train/is_clipped_frac": float((corrected.to(m.dtype) * m).sum()),
            "train/mismatch_ratio_max": float((token_w * m).max()) if m.any() else 1.0,
        }
    return weights * m, stats
