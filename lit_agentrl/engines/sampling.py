"""Sampling in SGLang's vocabulary: the parameters, validated once before any request is queued, and the
transformers engine's sampler, which penalises and truncates as SGLang's sampler does.

Semantics follow SGLang 0.5.23 (paths and lines below are under ``sglang/srt/`` in that release):

- Defaults and ranges: ``sampling/sampling_params.py`` 149-181 and ``verify`` 252-279.
- Penalties count the request's own generated tokens only, never its prompt: the penalisers are fed each newly
  sampled token (``penaltylib/frequency_penalty.py`` 39-47, ``presence_penalty.py`` 39-47,
  ``repetition_penalty.py`` 52-60, fed by ``managers/schedule_batch.py`` 3715-3735). They act on the raw logits,
  before temperature scaling and top-k/top-p/min-p (``model_executor/model_runner.py`` 2075-2093 penalises before
  ``layers/sampler.py`` 275 divides by the temperature): first the additive ones, ``logit - frequency_penalty *
  count - presence_penalty * [count > 0]``, then the repetition penalty on the result, which multiplies a negative
  logit of a token generated before and divides any other (``sampling/sampling_batch_info.py`` 426-437,
  ``penaltylib/repetition_penalty.py`` 10-16).
- Returned logprobs are taken after the penalties: SGLang's sampler computes them from the logits it is handed,
  already penalised (``layers/sampler.py`` 219-223 greedy, 306-316 sampled). They are therefore not what the
  trainer recomputes from the policy whenever a penalty is on.
- ``stop`` strings are matched on the decoded tail of the output (``SamplingParams.stop_window``); they need a
  tokenizer, and SGLang refuses them under ``skip_tokenizer_init`` (``sampling/sampling_params.py`` 440-457, called
  for every request at ``managers/tokenizer_manager.py`` 1566).

SGLang itself departs from the penalty semantics above in two ways, measured on the tiny model (see
``tests/engines/test_sglang_penalties.py``): its default overlap scheduler counts one token late (a decode step is
prepared before the previous step's token reaches the request, ``managers/scheduler.py`` 2084 and 2120, so the
prompt's last token is counted from the second output token on and the token just generated is not), and without
overlap it applies the penalties in the order of a set of classes (``sampling/sampling_batch_info.py`` 276-285,
``penaltylib/orchestrator.py`` 67-69), frequency, repetition, presence in our runs. Both are left out here.
"""

from __future__ import annotations

import torch

from lit_agentrl.config.sampling import SamplingParams

__all__ = ["SamplingParams", "apply_penalties", "sample_tokens"]


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams], counts: torch.Tensor) -> torch.Tensor:
    """SGLang's frequency, presence and repetition penalties, per row; returns the penalised logits.

    logits: [B, V] raw (not temperature-scaled); counts: [B, V], how often each row has generated each token
    (its prompt not counted). Additive penalties first, then the repetition penalty on their result, as
    ``sampling/sampling_batch_info.py`` 426-433 adds ``acc_additive_penalties`` and then applies
    ``acc_scaling_penalties`` (SGLang's default, overlap-scheduled path).
    """
    device = logits.device
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device).unsqueeze(-1)
    presence = torch.tensor([p.presence_penalty for p in params], device=device).unsqueeze(-1)
    repetition = torch.tensor([p.repetition_penalty for p in params], device=device).unsqueeze(-1)
    seen = counts > 0
    # penaltylib/frequency_penalty.py 39-47 and presence_penalty.py 39-47: ``logits.sub_(cumulated)``, cumulated =
    # the penalty per occurrence (scatter_add_) and the penalty once per token seen (scatter_).
    penalised = logits - frequency * counts - presence * seen
    # penaltylib/repetition_penalty.py 10-16 and 52-56: seen tokens get the penalty, others 1;
    # ``where(logits < 0, logits * scale, logits / scale)`` (a zero logit is divided, and stays zero).
    scale = torch.where(seen, repetition, torch.ones_like(repetition))
    return torch.where(penalised < 0, penalised * scale, penalised / scale)


def sample_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    uniforms: torch.Tensor,
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row with per-row penalties/temperature/top-k/top-p/min-p; returns (tokens, logprobs).

    logits: [B, V] float32; uniforms: [B] in [0, 1), one draw from each row's own stream (inverse-CDF
    sampling), so a row's tokens do not depend on which other rows share its batch. counts: [B, V] generated
    token counts per row, needed when a row has a penalty (:func:`apply_penalties`; None: no row has one).
    The logprob is that of the sampled token under softmax(penalised logits / T) (greedy rows: T = 1), i.e.
    after the penalties and before truncation, as SGLang returns it; without penalties that is what the trainer
    recomputes.
    """
    if counts is not None:
        logits = apply_penalties(logits, params, counts)
    elif any(p.penalised for p in params):
        raise ValueError("sample_tokens: a row has a penalty but no generated-token counts were given")
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
