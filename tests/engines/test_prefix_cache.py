"""The transformers engine's prefix reuse: a next turn prefilled from the finished turn's KV, and identical
prompts prefilled once, give what a fresh prefill gives (checked against the model itself)."""

from __future__ import annotations

import pytest
import torch
from test_transformers_engine import GREEDY, reference_greedy, reference_logprobs

from lit_agentrl.engines.base import output_logprobs
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.engines.prefix_cache import PrefixCache

TURN = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
TOOL_TURN = [40, 41, 42, 43]  # what a chat template appends after an assistant turn


@pytest.fixture()
def cached_engine(tiny_model_dir):
    engine = TransformersEngine(str(tiny_model_dir), seed=0)
    yield engine
    engine.shutdown()


def next_turn(prompt: list[int], result: dict) -> list[int]:
    return prompt + result["output_ids"] + TOOL_TURN


def test_next_turn_prefills_only_new_tokens_and_matches_the_model(cached_engine, policy_model):
    prompt = [5, 6, 7, 8, 9]
    first = cached_engine.generate(input_ids=prompt, sampling_params=TURN, return_logprob=True)
    second_prompt = next_turn(prompt, first)
    second = cached_engine.generate(input_ids=second_prompt, sampling_params=GREEDY, return_logprob=True)
    cache = cached_engine.prefix_cache
    assert cache.hits == 1 and cache.reused_tokens == len(prompt) + len(first["output_ids"]) - 1
    assert second["output_ids"] == reference_greedy(policy_model, second_prompt, GREEDY["max_new_tokens"])
    expected = reference_logprobs(policy_model, second_prompt, second["output_ids"])
    torch.testing.assert_close(torch.tensor(output_logprobs(second)), expected, atol=1e-4, rtol=0)


def test_one_prefill_mixes_cached_and_fresh_prompts_of_different_lengths(cached_engine, policy_model):
    firsts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15]]
    results = cached_engine.generate(input_ids=firsts, sampling_params=[TURN, {**TURN, "max_new_tokens": 3}])
    prompts = [next_turn(p, r) for p, r in zip(firsts, results)] + [[30, 31], [20, 21, 22, 23, 24, 25]]
    outs = cached_engine.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True)
    assert cached_engine.prefix_cache.hits == 2
    for prompt, out in zip(prompts, outs):
        assert out["output_ids"] == reference_greedy(policy_model, prompt, GREEDY["max_new_tokens"])
        expected = reference_logprobs(policy_model, prompt, out["output_ids"])
        torch.testing.assert_close(torch.tensor(output_logprobs(out)), expected, atol=1e-4, rtol=0)


def test_identical_prompts_share_a_prefill_and_keep_their_own_samples(cached_engine):
    prompt = [9, 10, 11, 12]
    params = [{"max_new_tokens": 8, "ignore_eos": True, "sampling_seed": seed} for seed in (1, 2, 3, 1)]
    together = cached_engine.generate(input_ids=[prompt] * 4, sampling_params=params, return_logprob=True)
    alone = [cached_engine.generate(input_ids=prompt, sampling_params=p, return_logprob=True) for p in params]
    assert [r["output_ids"] for r in together] == [r["output_ids"] for r in alone]
    assert together[0]["output_ids"] == together[3]["output_ids"] != together[1]["output_ids"]
    for a, b in zip(together, alone):
        torch.testing.assert_close(
            torch.tensor(output_logprobs(a)), torch.tensor(output_logprobs(b)), atol=1e-5, rtol=0
        )


def test_weight_updates_and_flush_drop_the_kept_prefixes(cached_engine):
    cached_engine.generate(input_ids=[5, 6, 7], sampling_params=TURN)
    assert len(cached_engine.prefix_cache) == 1
    name = "model.norm.weight"
    ok, _ = cached_engine.update_weights_from_tensor([(name, cached_engine.get_weights_by_name(name) * 2)])
    assert ok and len(cached_engine.prefix_cache) == 0
    cached_engine.generate(input_ids=[5, 6, 7], sampling_params=TURN)
    assert cached_engine.flush_cache() and len(cached_engine.prefix_cache) == 0


def test_prefix_cache_off(tiny_model_dir):
    engine = TransformersEngine(str(tiny_model_dir), prefix_cache_mb=0)
    try:
        first = engine.generate(input_ids=[5, 6, 7], sampling_params=TURN)
        engine.generate(input_ids=next_turn([5, 6, 7], first), sampling_params=TURN)
        assert engine.prefix_cache is None
    finally:
        engine.shutdown()


def _kv(tokens: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((1, tokens, 4), float(tokens)), torch.zeros(1, tokens, 4)) for _ in range(layers)]


def test_prefix_cache_takes_the_longest_prefix_leaves_one_token_and_evicts_least_recent():
    entry_bytes = 2 * 2 * 4 * 4  # per token: 2 layers x (keys + values) x 4 floats x 4 bytes
    cache = PrefixCache(max_bytes=10 * entry_bytes)
    cache.store([1, 2], _kv(2))
    cache.store([1, 2, 3, 4], _kv(4))
    cache.store([7, 8, 9], _kv(3))
    assert cache.pop_longest_prefix([5, 6]) is None
    hit = cache.pop_longest_prefix([1, 2, 3, 4, 5])
    # Taken out: its extension comes back.
    assert hit.length == 4 and hit.kv[0][0].shape == (1, 4, 4) and len(cache) == 2
    hit = cache.pop_longest_prefix([7, 8, 9])  # the whole prompt is cached: its last token is still fed
    assert hit.length == 2 and hit.kv[1][0].shape == (1, 2, 4)
    cache.store([20] * 6, _kv(6))
    cache.store([30] * 3, _kv(3))  # 2 + 6 + 3 tokens > 10: the least recent ([1, 2]) goes
    assert cache.pop_longest_prefix([1, 2, 3]) is None and len(cache) == 2
    assert cache.nbytes == 9 * entry_bytes
    cache.store([40] * 11, _kv(11))  # larger than the whole budget: not kept
    assert len(cache) == 2
