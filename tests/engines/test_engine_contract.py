"""One contract suite over every engine: the transformers engine (in-process and in a process of its own), in-process
SGLang, and an SGLang HTTP server.

SGLang needs its own environment (``scripts/build_sglang_env.sh``); there, ``.ci/run`` runs this file with
``LIT_AGENTRL_REQUIRE_SGLANG=1``, which turns a missing SGLang into a failure instead of a skip.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from support import SGLANG_CPU, require_sglang, running_http_engine
from transformers import AutoModelForCausalLM

from lit_agentrl.engines import get_engine_class
from lit_agentrl.engines.base import RolloutEngine, output_logprobs

GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33]]


@pytest.fixture(
    scope="module",
    params=[
        "transformers",
        "transformers_process",
        pytest.param("sglang", marks=pytest.mark.sglang),
        pytest.param("sglang_http", marks=pytest.mark.sglang),
    ],
)
def contract_engine(request, tiny_model_dir):
    kind = request.param
    if kind == "transformers":
        from lit_agentrl.engines.hf import TransformersEngine

        engine = TransformersEngine(str(tiny_model_dir))
        yield engine
        engine.shutdown()
        return
    if kind == "transformers_process":
        from lit_agentrl.engines.process import ProcessEngine

        engine = ProcessEngine(str(tiny_model_dir), threads=1)
        yield engine
        engine.shutdown()
        return
    require_sglang()
    from lit_agentrl.engines.sglang import SGLangEngine

    if kind == "sglang":
        engine = SGLangEngine(str(tiny_model_dir), seed=0, **SGLANG_CPU)
        yield engine
        engine.shutdown()
        return
    with running_http_engine(tiny_model_dir) as engine:
        yield engine


def run(engine, coro):
    """Run on the engine's own loop when it has one (in-process SGLang), else on a fresh one."""
    loop = engine.loop
    return loop.run_until_complete(coro) if loop is not None else asyncio.new_event_loop().run_until_complete(coro)


def generate_many(engine, prompts, params, return_logprob=False):
    async def many():
        return await asyncio.gather(
            *(
                engine.async_generate(input_ids=p, sampling_params=params, return_logprob=return_logprob)
                for p in prompts
            )
        )

    return run(engine, many())


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


def test_is_the_engine_registered_under_its_name(contract_engine, request):
    kind = request.node.callspec.params["contract_engine"]
    assert isinstance(contract_engine, RolloutEngine) and type(contract_engine) is get_engine_class(kind)
    assert contract_engine.shared == (kind == "sglang_http")
    assert (contract_engine.loop is not None) == (kind == "sglang")  # in-process SGLang is driven from its own loop
    assert (contract_engine.busy_seconds is None) == kind.startswith("sglang")


def test_greedy_tokens_and_logprobs_match_the_policy(contract_engine, policy_model):
    results = generate_many(contract_engine, PROMPTS, GREEDY, return_logprob=True)
    for prompt, result in zip(PROMPTS, results):
        assert result["output_ids"] == greedy_reference(policy_model, prompt, 8)
        meta = result["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 8
        assert [entry[1] for entry in meta["output_token_logprobs"]] == result["output_ids"]
        with torch.no_grad():
            logits = policy_model(torch.tensor([prompt + result["output_ids"]])).logits[0, len(prompt) - 1 : -1]
        expected = (
            torch.log_softmax(logits, -1).gather(-1, torch.tensor(result["output_ids"]).unsqueeze(-1)).squeeze(-1)
        )
        torch.testing.assert_close(torch.tensor(output_logprobs(result)), expected, atol=1e-4, rtol=0)


def test_sampled_logprobs_are_temperature_scaled(contract_engine, policy_model):
    (result,) = generate_many(
        contract_engine, [PROMPTS[1]], {"temperature": 0.7, "max_new_tokens": 8, "ignore_eos": True}, True
    )
    with torch.no_grad():
        logits = (
            policy_model(torch.tensor([PROMPTS[1] + result["output_ids"]])).logits[0, len(PROMPTS[1]) - 1 : -1] / 0.7
        )
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result["output_ids"]).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(torch.tensor(output_logprobs(result)), expected, atol=1e-4, rtol=0)


def test_stop_token_and_max_new_tokens(contract_engine, policy_model):
    greedy = greedy_reference(policy_model, PROMPTS[1], 8)
    stop = greedy[3]
    eos = policy_model.generation_config.eos_token_id
    end = min(i for i, t in enumerate(greedy) if t in (stop, eos))
    (stopped,) = generate_many(
        contract_engine, [PROMPTS[1]], {"temperature": 0.0, "max_new_tokens": 8, "stop_token_ids": [stop]}
    )
    assert stopped["output_ids"] == greedy[: end + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": greedy[end]}
    (ignored,) = generate_many(contract_engine, [PROMPTS[1]], {**GREEDY, "stop_token_ids": [stop]})
    assert ignored["output_ids"] == greedy  # ignore_eos turns every token stop off (SGLang's semantics)
    (short,) = generate_many(contract_engine, [PROMPTS[1]], {**GREEDY, "max_new_tokens": 3})
    assert short["output_ids"] == greedy[:3]


def test_several_samples_per_prompt(contract_engine):
    results = run(
        contract_engine,
        contract_engine.async_generate(input_ids=PROMPTS[:2], sampling_params={"max_new_tokens": 4, "n": 3}),
    )
    assert len(results) == 6 and all(1 <= len(r["output_ids"]) <= 4 for r in results)


def test_many_concurrent_requests(contract_engine, policy_model):
    prompts = [[3 + i, 4 + i % 5, 5] for i in range(48)]
    results = generate_many(contract_engine, prompts, {**GREEDY, "max_new_tokens": 5})
    for prompt, result in zip(prompts[::8], results[::8]):
        assert result["output_ids"] == greedy_reference(policy_model, prompt, 5)


def test_weight_update_changes_greedy_output_to_the_updated_model(contract_engine, tiny_model_dir):
    from lit_agentrl.bridge.weights import sync_weights

    updated = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in updated.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    (before,) = generate_many(contract_engine, [PROMPTS[1]], GREEDY)
    sync_weights(updated, [contract_engine], bucket_bytes=64 << 10)  # several buckets, one session
    (after,) = generate_many(contract_engine, [PROMPTS[1]], GREEDY)
    assert after["output_ids"] == greedy_reference(updated, PROMPTS[1], 8) != before["output_ids"]
    ok, message = contract_engine.update_weights_from_tensor([("model.norm.weight", torch.zeros(3))])
    assert not ok and "shape" in message
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sync_weights(original, [contract_engine])  # leave the module-scoped engine as it was


def test_a_lora_policys_merged_weights_make_the_engine_generate_as_the_policy(contract_engine, tiny_model_dir):
    """``model.lora.sync: merged``, the push every engine takes: each targeted weight with its adapter folded in."""
    from lit_agentrl.bridge.weights import sync_weights
    from lit_agentrl.config.training import Lora
    from lit_agentrl.training.lora import add_adapters

    lora = Lora(rank=4, base_dtype="float32")
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(2)
        add_adapters(policy, lora)
        for name, param in policy.named_parameters():
            if "lora_B" in name:  # as after training: B leaves its zero start
                param.copy_(torch.randn_like(param) * 0.5)
    (before,) = generate_many(contract_engine, [PROMPTS[1]], GREEDY)
    sync_weights(policy, [contract_engine], bucket_bytes=64 << 10, lora=lora)
    (after,) = generate_many(contract_engine, [PROMPTS[1]], GREEDY)
    assert after["output_ids"] == greedy_reference(policy, PROMPTS[1], 8) != before["output_ids"]
    sync_weights(AutoModelForCausalLM.from_pretrained(tiny_model_dir), [contract_engine])
