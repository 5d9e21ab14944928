"""The engine's context length (``RolloutEngine.context_length``), and requests that do not fit refused at the engines'
front door with :class:`PromptTooLongError` before anything is queued, as SGLang 0.5.23 refuses them: a prompt of
``context_length`` tokens or more, or an explicit ``max_new_tokens`` that takes prompt and output past it; an unset
``max_new_tokens`` is clipped to the ``context_length - 1`` tokens a request may hold. The SGLang engines' side is in
``test_sglang_abort_and_seeds.py``."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from lit_agentrl.engines import EngineWrapper, PromptTooLongError
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.engines.process import ProcessEngine
from lit_agentrl.errors import UserInputError

CONTEXT = 10


@pytest.fixture(scope="module")
def short_engine(tiny_model_dir):
    engine = TransformersEngine(str(tiny_model_dir), context_length=CONTEXT)
    yield engine
    engine.shutdown()


def generate(engine, prompt, params=None):
    return asyncio.run(engine.async_generate(input_ids=prompt, sampling_params=params))


def test_the_context_length_is_the_models_unless_engine_kwargs_set_it(engine, short_engine, tiny_model_dir):
    from transformers import AutoConfig

    assert engine.context_length == AutoConfig.from_pretrained(tiny_model_dir).max_position_embeddings
    assert short_engine.context_length == CONTEXT
    assert EngineWrapper(short_engine).context_length == CONTEXT
    with pytest.raises(UserInputError, match=r"engine\.kwargs\.context_length must be >= 2"):
        TransformersEngine(str(tiny_model_dir), context_length=1)


def test_a_prompt_that_fills_the_context_is_refused_before_it_is_queued(short_engine):
    before = short_engine.sampled_tokens
    with pytest.raises(
        PromptTooLongError, match="the prompt has 10 tokens, and the engine's context length is 10"
    ) as e:
        generate(short_engine, list(range(3, 13)))
    assert (e.value.prompt_tokens, e.value.context_length) == (10, CONTEXT) and isinstance(e.value, ValueError)
    with pytest.raises(PromptTooLongError):  # one prompt of a batch refuses the whole call
        generate(short_engine, [[3, 4], list(range(3, 23))])
    assert short_engine.sampled_tokens == before


def test_an_explicit_max_new_tokens_past_the_context_is_refused_and_a_default_one_clipped(short_engine):
    with pytest.raises(PromptTooLongError, match=r"7 tokens and max_new_tokens is 4: 11 tokens in all.* 10 tokens"):
        generate(short_engine, list(range(3, 10)), {"max_new_tokens": 4})
    exact = generate(short_engine, list(range(3, 10)), {"max_new_tokens": 3, "ignore_eos": True})
    assert len(exact["output_ids"]) == 3  # prompt and output fill the context exactly
    clipped = generate(short_engine, list(range(3, 10)), {"ignore_eos": True})  # SGLang's default, 128, clipped
    assert clipped["meta_info"]["finish_reason"] == {"type": "length", "length": CONTEXT - 1 - 7}


def test_the_error_survives_the_engine_process_pipe():
    error = pickle.loads(pickle.dumps(PromptTooLongError(12, 10, 5)))
    assert (error.prompt_tokens, error.context_length, error.max_new_tokens) == (12, 10, 5)
    assert str(error) == str(PromptTooLongError(12, 10, 5))


def test_the_engine_process_knows_its_context_length_and_refuses_in_the_callers_process(tiny_model_dir):
    engine = ProcessEngine(str(tiny_model_dir), threads=1, context_length=CONTEXT)
    try:
        assert engine.context_length == CONTEXT
        with pytest.raises(PromptTooLongError, match="the prompt has 12 tokens"):
            generate(engine, list(range(3, 15)))
        assert engine.sampled_tokens == 0
        clipped = generate(engine, list(range(3, 10)), {"ignore_eos": True})
        assert len(clipped["output_ids"]) == CONTEXT - 1 - 7
    finally:
        engine.shutdown()
