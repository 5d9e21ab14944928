"""The transformers engine honours SGLang's engine contract, checked against the model it serves."""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest
import torch

from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.engines import get_engine_class
from lit_agentrl.engines.base import RolloutEngine, output_logprobs
from lit_agentrl.engines.hf import TransformersEngine

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
    with pytest.raises(ValueError, match=r"engine\.kwargs\.dtype must be one of .*'float32'.*got 'int8'"):
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


def test_sampled_logprobs_hold_while_rows_join_and_leave_a_changing_batch(tiny_model_dir, policy_model):
    """Rows of different lengths join as others leave (at most 4 at once, so the last rows keep moving into the
    places of finished ones): every request's log-probs are still its own sequence's under the model."""
    engine = TransformersEngine(str(tiny_model_dir), max_running_requests=4, prefix_cache_mb=0)
    jobs = [([3 + i] * (1 + i % 5) + [40 + i], 1 + (i * 5) % 11) for i in range(14)]

    async def many():
        return await asyncio.gather(
            *(
                engine.async_generate(
                    input_ids=prompt,
                    sampling_params={"temperature": 1.0, "max_new_tokens": n, "ignore_eos": True},
                    return_logprob=True,
                )
                for prompt, n in jobs
            )
        )

    try:
        results = run(many())
    finally:
        engine.shutdown()
    for (prompt, n), result in zip(jobs, results):
        assert len(result["output_ids"]) == n
        expected = reference_logprobs(policy_model, prompt, result["output_ids"])
        torch.testing.assert_close(torch.tensor(output_logprobs(result)), expected, atol=1e-4, rtol=0)


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
        ({"stop_regex": "</s>"}, "unknown key"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"stop": 7}, "stop must be a string or a list of strings"),
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
    params = SamplingParams.of({})
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k) == (128, 1.0, 1.0, -1)


def test_shutdown_refuses_new_requests(tiny_model_dir):
    engine = TransformersEngine(str(tiny_model_dir))
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate(input_ids=[1], sampling_params={})


def test_once_shut_down_every_drain_of_the_queue_stops_even_after_another_drain_took_the_signal(tiny_model_dir):
    """Deterministic admission drains the queue without blocking while it admits; if that drain takes shutdown's
    signal, the scheduler's next, blocking drain must still stop (it waited forever, and shutdown 30 s)."""
    engine = TransformersEngine(str(tiny_model_dir))
    engine.shutdown()
    engine.scheduler._waiting.put(None)  # as shutdown leaves it for a scheduler that has not yet drained
    assert engine.scheduler._drain_queue(collections.deque(), block=False) is False  # admission's drain takes it
    results: list[bool] = []
    drain = threading.Thread(
        target=lambda: results.append(engine.scheduler._drain_queue(collections.deque(), True)), daemon=True
    )
    drain.start()
    drain.join(timeout=60)
    assert results == [False]  # the scheduler's blocking drain sees it too (and does not block)


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


# ---------------------------------------------------------------- penalties and stop strings (SGLang's semantics)
# The tiny random model, greedy, repeats its prompt's last token for ever (e.g. [5, 6, 7] -> 7, 7, 7, ...), and its
# logits span less than 2, so a presence penalty of 2 takes any token already generated out of the running.


def reference_penalised_greedy(model, prompt: list[int], n: int, fp=0.0, pp=0.0, rp=1.0) -> tuple[list[int], list]:
    """Greedy decoding with SGLang's penalties written out from scratch: counts of generated tokens only, additive
    penalties, then the repetition penalty, on raw logits; logprobs from the penalised logits."""
    out: list[int] = []
    logprobs = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, -1].clone()
        for token in set(out):
            logits[token] -= fp * out.count(token) + pp
            logits[token] = logits[token] * rp if logits[token] < 0 else logits[token] / rp
        out.append(int(logits.argmax()))
        logprobs.append(float(torch.log_softmax(logits, -1)[out[-1]]))
    return out, logprobs


def test_presence_penalty_stops_greedy_repeats_and_the_prompt_is_not_counted(engine, policy_model):
    plain = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)["output_ids"]
    assert plain == [7] * 10  # the prompt's last token, repeated
    result = engine.generate(input_ids=PROMPTS[0], sampling_params={**GREEDY, "presence_penalty": 2.0})
    out = result["output_ids"]
    assert out[0] == 7  # the prompt's own 7 is not counted against it (SGLang counts output tokens only)
    assert len(set(out)) == len(out) == 10  # every generated token is penalised by 2 > the logits' span
    assert out == reference_penalised_greedy(policy_model, PROMPTS[0], 10, pp=2.0)[0]


def test_frequency_penalty_counts_occurrences(engine, policy_model):
    # A small frequency penalty lets the favourite come back once its rivals have been penalised as often.
    params = {**GREEDY, "max_new_tokens": 12, "frequency_penalty": 0.3}
    out = engine.generate(input_ids=PROMPTS[3], sampling_params=params)["output_ids"]
    assert out == reference_penalised_greedy(policy_model, PROMPTS[3], 12, fp=0.3)[0]
    assert 1 < len(set(out)) < len(out)  # some tokens repeat, and no token runs away with all of them


def test_repetition_penalty_and_combined_penalties_match_the_reference(engine, policy_model):
    for penalties, keys in [
        ((0.0, 0.0, 2.0), {"repetition_penalty": 2.0}),
        ((0.2, 0.1, 1.5), {"frequency_penalty": 0.2, "presence_penalty": 0.1, "repetition_penalty": 1.5}),
    ]:
        result = engine.generate(input_ids=PROMPTS[1], sampling_params={**GREEDY, **keys}, return_logprob=True)
        expected, expected_logprobs = reference_penalised_greedy(policy_model, PROMPTS[1], 10, *penalties)
        assert result["output_ids"] == expected, keys
        # SGLang returns the logprobs of the penalised distribution (layers/sampler.py takes them from the logits
        # model_runner.py _preprocess_logits has already penalised).
        torch.testing.assert_close(
            torch.tensor(output_logprobs(result)), torch.tensor(expected_logprobs), atol=1e-4, rtol=0
        )


def test_sampled_logprobs_are_of_the_penalised_logits_over_temperature(engine, policy_model):
    params = {"temperature": 0.7, "max_new_tokens": 10, "ignore_eos": True, "frequency_penalty": 0.5}
    result = engine.generate(input_ids=PROMPTS[2], sampling_params=params, return_logprob=True)
    out = result["output_ids"]
    expected = []
    for k, token in enumerate(out):
        with torch.no_grad():
            logits = policy_model(torch.tensor([PROMPTS[2] + out[:k]])).logits[0, -1].clone()
        for seen in set(out[:k]):
            logits[seen] -= 0.5 * out[:k].count(seen)
        expected.append(float(torch.log_softmax(logits / 0.7, -1)[token]))
    torch.testing.assert_close(torch.tensor(output_logprobs(result)), torch.tensor(expected), atol=1e-4, rtol=0)


def test_each_request_keeps_its_own_counts_in_a_changing_batch(engine, policy_model):
    jobs = [
        (PROMPTS[0], {**GREEDY, "max_new_tokens": 9, "presence_penalty": 2.0}, (0.0, 2.0, 1.0)),
        (PROMPTS[1], {**GREEDY, "max_new_tokens": 3}, (0.0, 0.0, 1.0)),
        (PROMPTS[0], {**GREEDY, "max_new_tokens": 6, "frequency_penalty": 0.3}, (0.3, 0.0, 1.0)),
        (PROMPTS[3], {**GREEDY, "max_new_tokens": 12, "repetition_penalty": 1.8}, (0.0, 0.0, 1.8)),
    ]

    async def together():
        return await asyncio.gather(*(engine.async_generate(input_ids=p, sampling_params=s) for p, s, _ in jobs))

    for (prompt, params, penalties), result in zip(jobs, run(together())):
        expected = reference_penalised_greedy(policy_model, prompt, params["max_new_tokens"], *penalties)[0]
        assert result["output_ids"] == expected


def test_a_later_turn_does_not_count_the_earlier_turns_output(engine, policy_model):
    params = {**GREEDY, "max_new_tokens": 5, "presence_penalty": 2.0}
    first = engine.generate(input_ids=PROMPTS[0], sampling_params=params)["output_ids"]
    second_prompt = PROMPTS[0] + first + [40]  # extends the finished request: prefilled from the prefix cache
    second = engine.generate(input_ids=second_prompt, sampling_params=params)["output_ids"]
    assert second == reference_penalised_greedy(policy_model, second_prompt, 5, pp=2.0)[0]


def penalised_greedy_text(engine, tokenizer, n=10):
    out = engine.generate(
        input_ids=PROMPTS[0], sampling_params={**GREEDY, "max_new_tokens": n, "presence_penalty": 2.0}
    )
    return out["output_ids"], [tokenizer.decode([t]) for t in out["output_ids"]]


def test_a_stop_string_ends_generation_with_its_finish_reason(engine, tokenizer):
    ids, pieces = penalised_greedy_text(engine, tokenizer)
    stop = pieces[4] + pieces[5]  # the text of two generated tokens
    end = next(k for k in range(1, 11) if stop in "".join(pieces[:k]))  # the first token that completes it
    result = engine.generate(
        input_ids=PROMPTS[0], sampling_params={**GREEDY, "presence_penalty": 2.0, "stop": ["never there", stop]}
    )
    # ignore_eos (in GREEDY) does not turn stop strings off; the ids keep the stop string's tokens, as SGLang's
    # output_ids_through_stop does (schedule_batch.py: "Stop position is included"); only its text is trimmed.
    assert result["output_ids"] == ids[:end]
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert result["meta_info"]["completion_tokens"] == end


def test_a_stop_string_on_the_last_allowed_token_is_a_stop_not_a_length(engine, tokenizer):
    ids, pieces = penalised_greedy_text(engine, tokenizer, n=4)
    params = {**GREEDY, "max_new_tokens": 4, "presence_penalty": 2.0, "stop": pieces[3]}
    assert pieces[3] not in "".join(pieces[:3])  # the premise: it first occurs in the fourth token
    result = engine.generate(input_ids=PROMPTS[0], sampling_params=params)
    assert result["output_ids"] == ids
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": pieces[3]}


def test_stop_strings_without_a_tokenizer_are_refused_by_name(tiny_model_dir, tmp_path):
    import shutil

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, model_dir / name)
    engine = TransformersEngine(str(model_dir))
    try:
        with pytest.raises(ValueError, match=r"sampling_params\.stop: .*tokenizer"):
            engine.generate(input_ids=[1, 2], sampling_params={"stop": ["x"]})
        assert engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2, "ignore_eos": True})
    finally:
        engine.shutdown()
