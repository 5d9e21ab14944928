"""The transformers engine's truncation follows SGLang's sampler, which transformers' logits warpers do not."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from lit_agentrl.engines.sampling import SamplingParams, _truncate, apply_penalties, sample_tokens


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


# ---------------------------------------------------------------- penalties (SGLang's penaltylib), hand-derived values

LOGITS = [[2.0, -1.0, 0.5, 0.0]]
COUNTS = [[2.0, 1.0, 0.0, 1.0]]  # token 0 generated twice, tokens 1 and 3 once, token 2 never


def penalised(**params: float) -> list[float]:
    out = apply_penalties(torch.tensor(LOGITS), [SamplingParams(**params)], torch.tensor(COUNTS))
    return out[0].tolist()


def test_frequency_penalty_subtracts_once_per_occurrence():
    # 2 - 0.5*2, -1 - 0.5*1, 0.5 - 0, 0 - 0.5*1
    assert penalised(frequency_penalty=0.5) == [1.0, -1.5, 0.5, -0.5]


def test_presence_penalty_subtracts_once_per_token_seen():
    # 2 - 0.5, -1 - 0.5, 0.5 (never generated), 0 - 0.5
    assert penalised(presence_penalty=0.5) == [1.5, -1.5, 0.5, -0.5]


def test_negative_penalties_encourage_repeats():
    assert penalised(frequency_penalty=-1.0) == [4.0, 0.0, 0.5, 1.0]


def test_repetition_penalty_divides_positive_logits_and_multiplies_negative_ones_of_seen_tokens():
    # seen: 2/2 = 1, -1*2 = -2, 0/2 = 0 (zero is divided: sglang penaltylib/repetition_penalty.py
    # apply_scaling_penalties takes the multiplication only for logits < 0); unseen token 2 keeps 0.5
    assert penalised(repetition_penalty=2.0) == [1.0, -2.0, 0.5, 0.0]


def test_repetition_penalty_below_one_rewards_seen_tokens():
    assert penalised(repetition_penalty=0.5) == [4.0, -0.5, 0.5, 0.0]


def test_additive_penalties_come_before_the_repetition_penalty():
    # sglang sampling/sampling_batch_info.py _apply_pre_grammar_logits_transforms: add the additive sum, then scale.
    # token 0: 2 - 0.75*2 - 0.25 = 0.25 -> /2 = 0.125; token 1: -1 - 0.75 - 0.25 = -2 -> *2 = -4
    # token 3: 0 - 0.75 - 0.25 = -1 -> *2 = -2 (it turned negative, so it is multiplied, not divided)
    assert penalised(frequency_penalty=0.75, presence_penalty=0.25, repetition_penalty=2.0) == [0.125, -4.0, 0.5, -2.0]


def test_penalties_apply_before_temperature_and_logprobs_are_taken_after_them():
    params = [SamplingParams(temperature=0.5, frequency_penalty=0.5)]
    # penalised logits [1, -1.5, 0.5, -0.5], then / 0.5 -> [2, -3, 1, -1]; the draw 0.999 takes the last token
    tokens, logprobs = sample_tokens(torch.tensor(LOGITS), params, torch.tensor([0.999]), torch.tensor(COUNTS))
    expected = torch.log_softmax(torch.tensor([2.0, -3.0, 1.0, -1.0]), -1)
    assert tokens.tolist() == [3]
    torch.testing.assert_close(logprobs, expected[3:])


def test_greedy_rows_take_the_argmax_of_the_penalised_logits_at_temperature_one():
    params = [SamplingParams(temperature=0.0, frequency_penalty=1.0)]
    tokens, logprobs = sample_tokens(torch.tensor(LOGITS), params, torch.tensor([0.5]), torch.tensor(COUNTS))
    # penalised: [0, -2, 0.5, -1]: token 2 overtakes token 0
    assert tokens.tolist() == [2]
    torch.testing.assert_close(logprobs, torch.log_softmax(torch.tensor([0.0, -2.0, 0.5, -1.0]), -1)[2:3])


def test_penalties_are_per_row_and_rows_without_one_are_untouched():
    logits = torch.tensor(LOGITS * 3)
    counts = torch.tensor(COUNTS * 3)
    params = [SamplingParams(presence_penalty=0.5), SamplingParams(), SamplingParams(repetition_penalty=2.0)]
    out = apply_penalties(logits, params, counts)
    assert out.tolist() == [[1.5, -1.5, 0.5, -0.5], LOGITS[0], [1.0, -2.0, 0.5, 0.0]]


def test_a_penalised_row_without_counts_is_an_error():
    with pytest.raises(ValueError, match="counts"):
        sample_tokens(torch.tensor(LOGITS), [SamplingParams(presence_penalty=0.1)], torch.tensor([0.5]))


# ---------------------------------------------------------------- the new keys' validation (SGLang's ranges)


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"frequency_penalty": 2.5}, r"frequency_penalty must be in \[-2, 2\]"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"presence_penalty": -2.01}, r"presence_penalty must be in \[-2, 2\]"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \(0, 2\]"),
        ({"repetition_penalty": 2.5}, "repetition_penalty"),
        ({"stop": [1, 2]}, "stop must be a string or a list of strings"),
        ({"stop": ["x"] * 33}, "at most 32"),
    ],
)
def test_out_of_range_keys_are_refused_by_name(params, fragment):
    with pytest.raises(ValueError, match=fragment):
        SamplingParams.of(params)


def test_new_keys_follow_sglang_defaults_and_shapes():
    params = SamplingParams.of({"stop": "</s>", "frequency_penalty": None})
    assert params.stop == ("</s>",) and params.frequency_penalty == 0.0
    assert (params.presence_penalty, params.repetition_penalty) == (0.0, 1.0) and not params.penalised
    assert SamplingParams.of({"stop": ["a", "b"], "repetition_penalty": 1.1}).stop == ("a", "b")
    assert SamplingParams.of({"stop": None}).stop == ()


def test_stop_strings_are_refused_where_there_is_no_tokenizer():
    SamplingParams.of({"presence_penalty": 1.0}).check_without_tokenizer("sglang")
    with pytest.raises(ValueError, match=r"stop=\['\\n'\].*'sglang'.*skip_tokenizer_init"):
        SamplingParams.of({"stop": "\n"}).check_without_tokenizer("sglang")


def test_a_calls_parameters_may_lower_the_length_and_add_stops_but_not_change_the_sampling(caplog):
    run = SamplingParams.of({"max_new_tokens": 64, "temperature": 0.8, "top_p": 0.9, "stop_token_ids": [7]})
    assert run.for_call(None, "test") is run and run.for_call(run, "test") is run
    assert run.for_call(dict(run), "test") is run  # an agent handing the run's dict back changes nothing
    call = run.for_call({"max_new_tokens": 16, "stop_token_ids": [9], "stop": "END"}, "test")
    assert (call.max_new_tokens, call.stop_token_ids, call.stop, call.temperature) == (16, (7, 9), ("END",), 0.8)
    with caplog.at_level(logging.WARNING, logger="lit_agentrl.config.sampling"):
        kept = run.for_call({"temperature": 0.2, "max_new_tokens": 512, "top_p": 0.5}, "test-caller")
        run.for_call({"temperature": 0.3}, "test-caller")
    assert kept is run  # a higher limit and another temperature or top_p are not used
    said = [r.message for r in caplog.records if "test-caller asked for" in r.message]
    assert len(said) == 3 and any("temperature=0.2; the rollout's temperature=0.8 is used" in m for m in said)
    with pytest.raises(ValueError, match="test: sampling_params: top_p must be in"):
        run.for_call({"top_p": 2.0}, "test")


def test_the_parameters_read_as_sglangs_dict():
    params = SamplingParams.of({"max_new_tokens": 8, "stop": "x"})
    assert dict(params) == {"max_new_tokens": 8, "stop": ["x"]} == params.to_request()
    assert params["max_new_tokens"] == 8 and params.get("temperature", 1.0) == 1.0 and "stop" in params
    assert bool(SamplingParams()) and SamplingParams.of(params) is params
