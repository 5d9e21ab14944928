"""The transformers engine's truncation follows SGLang's sampler, which transformers' logits warpers do not."""

from __future__ import annotations

import math

import torch

from lit_agentrl.engines.sampling import SamplingParams, _truncate, sample_tokens


def kept(probs: list[float], **params: float) -> list[int]:
    logits = torch.tensor([[math.log(p) for p in probs]])
    return torch.isfinite(_truncate(logits, [SamplingParams(**params)]))[0].nonzero().squeeze(-1).tolist()


def test_top_k_keeps_exactly_k_even_among_ties():
    assert len(kept([0.25, 0.25, 0.25, 0.25], top_k=2)) == 2  # TopKLogitsWarper keeps all four


def test_top_p_keeps_a_token_while_the_mass_above_it_is_at_most_top_p():
    assert kept([0.25, 0.25, 0.25, 0.25], top_p=0.5) == [0, 1, 2]  # TopPLogitsWarper keeps two


def test_top_p_is_judged_on_the_whole_distribution_not_after_top_k():
    # After top-k the two survivors renormalise to (0.71, 0.29): a top-k -> top-p chain would drop token 1.
    assert kept([0.5, 0.2, 0.2, 0.1], top_k=2, top_p=0.6) == [0, 1]


def test_min_p_is_relative_to_the_most_likely_token():
    assert kept([0.5, 0.3, 0.15, 0.05], min_p=0.3) == [0, 1, 2]


def test_each_row_is_truncated_and_sampled_by_its_own_settings():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g)
    params = [SamplingParams(top_k=3), SamplingParams(top_p=0.3, temperature=0.5), SamplingParams(temperature=0.0)]
    uniforms = torch.tensor([0.1, 0.7, 0.4])
    tokens, logprobs = sample_tokens(logits, params, uniforms)
    for row in range(3):
        alone, alone_logprob = sample_tokens(logits[row : row + 1], params[row : row + 1], uniforms[row : row + 1])
        assert tokens[row] == alone[0] and logprobs[row] == alone_logprob[0]
    assert tokens[0] in logits[0].topk(3).indices and tokens[2] == logits[2].argmax()
