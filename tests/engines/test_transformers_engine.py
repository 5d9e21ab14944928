"""The transformers engine honours SGLang's engine contract, checked against the model it serves."""

from __future__ import annotations

import asyncio

import pytest
import torch

from lit_agentrl.engines import get_engine_class
from lit_agentrl.engines.base import RolloutEngine, output_logprobs
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.engines.sampling import SamplingParams

GREEDY = {"temperature": 0.0, "max_new_tokens": 10, "ignore_eos": True}
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20], [30, 31, 32, 33]]


def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


def reference_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output).unsqueeze(-1)).squeeze(-1)


def run(coro):
    return asyncio.run(coro)


def test_is_the_registered_rollout_engine(engine):
    assert isinstance(engine, RolloutEngine) and get_engine_class("transformers") is TransformersEngine
    assert engine.shared is False and engine.loop is None
    assert isinstance(engine.busy_seconds, float)  # it counts its compute, unlike SGLang


def test_unknown_dtype_names_the_setting(tiny_model_dir):
    with pytest.raises(ValueError, match=r"engine_kwargs\.dtype must be one of .*'float32'.*got 'int8'"):
        TransformersEngine(str(tiny_model_dir), dtype="int8")


def test_concurrent_greedy_matches_generate(engine, policy_model):
    async def many():
        return await asyncio.gather(
            *(engine.async_generate(input_ids=p, sampling_params=GREEDY, return_logprob=True) for p in PROMPTS)
        )

    for prompt, result in zip(PROMPTS, run(many())):
        assert result["output_ids"] == reference_greedy(policy_model, prompt, 10)
        assert result["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
        assert result["meta_info"]["completion_tokens"] == 10
        assert result["meta_info"]["prompt_tokens"] == len(prompt)


def test_logprobs_match_policy_at_temperature(engine, policy_model):
    params = {"temperature": 0.7, "max_new_tokens": 12, "ignore_eos": True}
    result = run(engine.async_generate(input_ids=PROMPTS[1], sampling_params=params, return_logprob=True))
    entries = result["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in entries] == result["output_ids"]
    expected = reference_logprobs(policy_model, PROMPTS[1], result["output_ids"], temperature=0.7)
    torch.testing.assert_close(torch.tensor(output_logprobs(result)), expected, atol=1e-4, rtol=0)


def test_batch_input_and_n_samples(engine):
    results = run(engine.async_generate(input_ids=PROMPTS[:2], sampling_params={"max_new_tokens": 4, "n": 3}))
    assert len(results) == 6
    assert all(1 <= len(r["output_ids"]) <= 4 for r in results)
    assert "output_token_logprobs" not in results[0]["meta_info"]


def test_stop_token_ids_end_generation(engine, policy_model):
    greedy = reference_greedy(policy_model, PROMPTS[0], 10)
    stop = greedy[3]
    first = greedy.index(stop)
    params = {"temperature": 0.0, "max_new_tokens": 10, "stop_token_ids": [stop]}
    result = engine.generate(input_ids=PROMPTS[0], sampling_params=params)
    assert result["output_ids"] == greedy[: first + 1]
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_eos_from_generation_config_ends_generation_unless_ignored(tiny_model_dir, policy_model, tmp_path):
    import shutil

    from transformers import GenerationConfig

    greedy = reference_greedy(policy_model, PROMPTS[0], 10)
    eos = greedy[2]
    model_dir = shutil.copytree(tiny_model_dir, tmp_path / "model")
    GenerationConfig(eos_token_id=[eos, 999_999]).save_pretrained(model_dir)
    engine = TransformersEngine(str(model_dir))
    try:
        stopped = engine.generate(input_ids=PROMPTS[0], sampling_params={"temperature": 0, "max_new_tokens": 10})
        ignored = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
    finally:
        engine.shutdown()
    assert stopped["output_ids"] == greedy[: greedy.index(eos) + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
    assert ignored["output_ids"] == greedy


def test_max_new_tokens_zero_and_one(engine):
    assert engine.generate(input_ids=[5], sampling_params={"max_new_tokens": 0})["output_ids"] == []
    one = engine.generate(input_ids=[5], sampling_params={"max_new_tokens": 1, "ignore_eos": True})
    assert len(one["output_ids"]) == 1


def test_many_concurrent_requests_beyond_running_limit(tiny_model_dir, policy_model):
    engine = TransformersEngine(str(tiny_model_dir), max_running_requests=3)
    lengths = [1 + (i * 7) % 13 for i in range(20)]

    async def many():
        return await asyncio.gather(
            *(
                engine.async_generate(input_ids=[3 + i, 4, 5], sampling_params={**GREEDY, "max_new_tokens": n})
                for i, n in enumerate(lengths)
            )
        )

    try:
        results = run(many())
    finally:
        engine.shutdown()
    for i, (n, result) in enumerate(zip(lengths, results)):
        assert result["output_ids"] == reference_greedy(policy_model, [3 + i, 4, 5], n)


def test_weight_update_changes_greedy_output_to_updated_model(engine, policy_model, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    updated = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    torch.manual_seed(123)
    with torch.no_grad():
        for p in updated.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    before = engine.generate(input_ids=PROMPTS[1], sampling_params=GREEDY)["output_ids"]
    ok, message = engine.update_weights_from_tensor(list(updated.state_dict().items()))
    assert ok, message
    after = engine.generate(input_ids=PROMPTS[1], sampling_params=GREEDY)["output_ids"]
    assert after == reference_greedy(updated, PROMPTS[1], 10)
    assert after != before
    torch.testing.assert_close(
        engine.get_weights_by_name("model.layers.0.mlp.up_proj.weight"),
        updated.get_parameter("model.layers.0.mlp.up_proj.weight"),
        atol=0,
        rtol=0,
    )


def test_weight_update_rejects_unknown_name_and_bad_shape(engine):
    ok, message = engine.update_weights_from_tensor([("not.a.weight", torch.zeros(2))])
    assert not ok and "not.a.weight" in message
    ok, message = engine.update_weights_from_tensor([("model.norm.weight", torch.zeros(3))])
    assert not ok and "shape" in message


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_new_tokens": -2}, "max_new_tokens"),
        ({"stop": ["</s>"]}, "unknown key"),
    ],
)
def test_invalid_sampling_params_are_refused(engine, params, fragment):
    with pytest.raises(ValueError, match=fragment):
        engine.generate(input_ids=[1, 2], sampling_params=params)


def test_top_k_one_is_greedy(engine, policy_model):
    result = engine.generate(
        input_ids=PROMPTS[0], sampling_params={"top_k": 1, "max_new_tokens": 6, "ignore_eos": True}
    )
    assert result["output_ids"] == reference_greedy(policy_model, PROMPTS[0], 6)


def test_sampling_params_defaults_follow_sglang():
    params = SamplingParams.from_dict({})
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k) == (128, 1.0, 1.0, -1)


def test_shutdown_refuses_new_requests(tiny_model_dir):
    engine = TransformersEngine(str(tiny_model_dir))
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate(input_ids=[1], sampling_params={})


def test_samples_do_not_depend_on_batch_company_and_reseed_replays(engine):
    params = {"max_new_tokens": 8, "ignore_eos": True, "temperature": 1.0}
    engine.reseed(11)
    alone = engine.generate(input_ids=PROMPTS[0], sampling_params=params)["output_ids"]

    async def crowd():
        return await asyncio.gather(
            *(engine.async_generate(input_ids=p, sampling_params=params) for p in [PROMPTS[0], *PROMPTS[1:]] * 3)
        )

    engine.reseed(11)
    crowded = run(crowd())
    assert crowded[0]["output_ids"] == alone
    engine.reseed(11)
    assert run(crowd())[5]["output_ids"] == crowded[5]["output_ids"]
    per_request = {"sampling_seed": 5, **params}
    a = engine.generate(input_ids=PROMPTS[2], sampling_params=per_request)["output_ids"]
    b = engine.generate(input_ids=PROMPTS[2], sampling_params=per_request)["output_ids"]
    assert a == b
