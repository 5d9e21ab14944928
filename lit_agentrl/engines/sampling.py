"""Sampling in SGLang's vocabulary: the parameters, validated once before any request is queued, and the
transformers engine's sampler, which truncates as SGLang's sampler does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingParams:
    """The subset of SGLang's ``sampling_params`` that a token-in/token-out rollout uses.

    Keys and defaults follow SGLang, so the same dict drives both engines. ``stop`` (strings) is not
    supported: engines run with ``skip_tokenizer_init``, so stopping is by token id (``stop_token_ids``).
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    n: int = 1
    sampling_seed: int | None = None

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None, *, where: str = "sampling_params") -> SamplingParams:
        """Build from a dict, raising ``ValueError`` that names the bad key and the valid range."""
        params = dict(params or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys are {sorted(known)}")
        if "stop_token_ids" in params:
            params["stop_token_ids"] = tuple(int(t) for t in (params["stop_token_ids"] or ()))
        sp = cls(**params)
        sp._check(where)
        return sp

    def _check(self, where: str) -> None:
        checks = [
            (self.max_new_tokens >= 0, "max_new_tokens must be >= 0"),
            (self.temperature >= 0.0, "temperature must be >= 0 (0 means greedy)"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k must be -1 (off) or >= 1"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            (self.n >= 1, "n must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{where}: {message}; got {self}")


def sample_tokens(
    logits: torch.Tensor, params: list[SamplingParams], uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row with per-row temperature/top-k/top-p/min-p; returns (tokens, logprobs).

    logits: [B, V] float32; uniforms: [B] in [0, 1), one draw from each row's own stream (inverse-CDF
    sampling), so a row's tokens do not depend on which other rows share its batch. The logprob is that
    of the sampled token under softmax(logits / T) (raw logits for greedy rows), i.e. before truncation,
    matching what the trainer recomputes.
    """
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    filtered = _truncate(scaled, params)
    probs = torch.softmax(filtered, dim=-1)
    cdf = probs.cumsum(dim=-1)
    sampled = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1)).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logprobs_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _truncate(scaled: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Mask logits outside each row's top-k / top-p / min-p set with -inf.

    SGLang's rules (``top_k_top_p_min_p_sampling_from_probs_torch``), all three judged on the one full
    distribution: top-k keeps exactly k tokens by rank, top-p keeps a token while the mass ranked above it is
    at most top_p, min-p compares with the most likely token. transformers' ``TopK/TopP/MinPLogitsWarper`` do
    not give the same sets, so they are not used here: top-k keeps every token tied with the k-th, top-p keeps
    a token only while that mass is below top_p (cumulated from the least likely end, whose float error moves
    the cut), a chain of them judges top-p on the top-k-renormalised distribution, and each takes one scalar,
    so per-row settings would need a chain per distinct setting.
    """
    if all(p.top_k == -1 and p.top_p >= 1.0 and p.min_p <= 0.0 for p in params):
        return scaled
    device = scaled.device
    vocab = scaled.shape[-1]
    top_k = torch.tensor([vocab if p.top_k == -1 else min(p.top_k, vocab) for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    min_p = torch.tensor([p.min_p for p in params], device=device)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    drop = ranks >= top_k.unsqueeze(-1)
    drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_p.unsqueeze(-1)
    drop |= sorted_probs < min_p.unsqueeze(-1) * sorted_probs[:, :1]
    drop[:, 0] = False  # the most likely token always survives
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
