"""``model.lora.sync: adapter`` on every engine that serves adapters: the transformers engine, in-process SGLang and an
SGLang server, each started as the trainer starts it (``RolloutEngine.lora_engine_kwargs``). After a push the engine
generates the adapted policy's greedy tokens with its log-probs; the next push replaces the adapter, and SGLang unloads
the old one once no request uses it.

SGLang's LoRA layers pin host memory, which needs CUDA: on CPU (CI's SGLang stage) the test shim makes pinning a no-op
(``tests/sglang_shim/README.md``); every computation is SGLang's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import torch
from support import SGLANG_CPU, require_router, require_sglang, running_http_engine, sglang_server, smg_router
from transformers import AutoModelForCausalLM

from lit_agentrl.bridge.weights import sync_weights
from lit_agentrl.config.training import Lora
from lit_agentrl.engines.base import RolloutEngine, output_logprobs
from lit_agentrl.training.lora import add_adapters

LORA = Lora(rank=4, base_dtype="float32", sync="adapter")
GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
PROMPT = [9, 10, 11, 12, 13, 14, 15]


@pytest.fixture(
    scope="module",
    params=[
        "transformers",
        pytest.param("sglang", marks=pytest.mark.sglang),
        pytest.param("sglang_http", marks=pytest.mark.sglang),
        pytest.param("sglang_router", marks=pytest.mark.sglang),
    ],
)
def adapter_engine(request: pytest.FixtureRequest, tiny_model_dir: Any) -> Iterator[RolloutEngine]:
    if request.param == "transformers":
        from lit_agentrl.engines.hf import TransformersEngine

        engine: RolloutEngine = TransformersEngine(str(tiny_model_dir), prefix_cache_mb=1)
        yield engine
        engine.shutdown()
        return
    require_sglang()
    from lit_agentrl.engines.sglang import SGLangEngine
    from lit_agentrl.engines.sglang_group import server_flags

    serving = SGLangEngine.lora_engine_kwargs(LORA, SGLANG_CPU)
    if request.param == "sglang":
        engine = SGLangEngine(str(tiny_model_dir), seed=0, **serving, **SGLANG_CPU)
        yield engine
        engine.shutdown()
        return
    if request.param == "sglang_http":
        with running_http_engine(tiny_model_dir, extra_args=server_flags(serving)) as engine:
            yield engine
        return
    from lit_agentrl.engines.sglang_router import SGLangRouterEngine

    require_router()
    with ExitStack() as stack:  # two servers behind the router: each load reaches both
        urls = [stack.enter_context(sglang_server(tiny_model_dir, server_flags(serving)))[0] for _ in range(2)]
        engine = SGLangRouterEngine(stack.enter_context(smg_router(urls)), str(tiny_model_dir))
        stack.callback(engine.shutdown)
        yield engine


def adapted_policy(model_dir: Any, seed: int) -> torch.nn.Module:
    """The tiny model with LORA's adapters, B drawn away from its zero start (as after updates)."""
    policy = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        add_adapters(policy, LORA)
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.5)
    return policy


def generate(engine: RolloutEngine, prompt: list[int] = PROMPT) -> dict[str, Any]:
    coro = engine.async_generate(input_ids=prompt, sampling_params=GREEDY, return_logprob=True)
    loop = engine.loop or asyncio.new_event_loop()
    return loop.run_until_complete(coro)  # type: ignore[no-any-return]


def greedy_with_logprobs(model: torch.nn.Module, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None)
        tokens = out[0, len(prompt) :]
        logits = model(out).logits[0, len(prompt) - 1 : -1]
    return tokens.tolist(), torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def test_the_engine_serves_the_pushed_adapter_then_its_replacement(adapter_engine, tiny_model_dir):
    base = generate(adapter_engine)["output_ids"]
    for seed in (2, 3):  # the second push replaces the first adapter
        policy = adapted_policy(tiny_model_dir, seed)
        pushed = sync_weights(policy, [adapter_engine], lora=LORA, weight_version=seed)
        assert pushed.tensors == 2 * policy.config.num_hidden_layers * len(LORA.target_modules)
        result = generate(adapter_engine)
        tokens, logprobs = greedy_with_logprobs(policy, PROMPT)
        assert result["output_ids"] == tokens != base
        torch.testing.assert_close(torch.tensor(output_logprobs(result)), logprobs, atol=1e-4, rtol=0)
        assert adapter_engine.weight_version == seed
    if hasattr(adapter_engine, "adapter_name"):  # SGLang: one adapter a push, the replaced one unloaded
        assert adapter_engine.adapter_name == "lit-agentrl-policy-2"
        assert adapter_engine._retired_adapters == []


def test_an_adapter_in_use_is_unloaded_once_its_requests_end(adapter_engine, tiny_model_dir):
    if not hasattr(adapter_engine, "adapter_name"):
        pytest.skip("the transformers engine updates its one adapter in place")
    sync_weights(adapted_policy(tiny_model_dir, 4), [adapter_engine], lora=LORA)
    in_use = adapter_engine.adapter_name
    adapter_engine._adapter_requests[in_use] += 1  # a request of this client still decoding on it
    sync_weights(adapted_policy(tiny_model_dir, 5), [adapter_engine], lora=LORA)
    assert adapter_engine._retired_adapters == [in_use]  # kept: SGLang would hold the unload until it ends
    adapter_engine._adapter_requests[in_use] -= 1
    policy = adapted_policy(tiny_model_dir, 6)
    sync_weights(policy, [adapter_engine], lora=LORA)
    assert adapter_engine._retired_adapters == []
    assert generate(adapter_engine)["output_ids"] == greedy_with_logprobs(policy, PROMPT)[0]


@pytest.mark.sglang
def test_sglang_names_what_it_lacks_to_serve_an_adapter(adapter_engine):
    if not hasattr(adapter_engine, "adapter_name"):
        pytest.skip("SGLang's server arguments")
    assert adapter_engine.lora_serving_problem(LORA) is None
    problem = adapter_engine.lora_serving_problem(Lora(rank=8, sync="adapter"))
    assert problem is not None and "rank 4 (--max-lora-rank), below 8" in problem


@pytest.mark.sglang
def test_behind_the_router_every_server_serves_the_pushed_adapter(adapter_engine, tiny_model_dir):
    from lit_agentrl.context import TrajectoryContext, enter_trajectory

    if not hasattr(adapter_engine, "served_by"):
        pytest.skip("the router's engine only")
    policy = adapted_policy(tiny_model_dir, 7)
    sync_weights(policy, [adapter_engine], lora=LORA)
    trajectories = [TrajectoryContext() for _ in range(8)]

    async def each() -> list[list[int]]:
        async def one(context: TrajectoryContext) -> list[int]:
            enter_trajectory(context)
            return (await adapter_engine.async_generate(input_ids=PROMPT, sampling_params=GREEDY))["output_ids"]

        return await asyncio.gather(*(asyncio.create_task(one(t)) for t in trajectories))

    assert all(tokens == greedy_with_logprobs(policy, PROMPT)[0] for tokens in asyncio.run(each()))
    assert len({adapter_engine.served_by(t.route_key) for t in trajectories}) == 2  # both servers answered
