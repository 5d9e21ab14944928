"""Penalties and stop strings against SGLang 0.5.23 itself (run where SGLang is installed, like the contract suite).

The transformers engine implements SGLang's penalties as SGLang designs them: counts of the request's generated
tokens (never its prompt), frequency and presence subtracted from the raw logits, then the repetition penalty, all
before temperature, and logprobs taken after them. SGLang itself is consistent with that only in part, which is why
the SGLang engine here runs with ``disable_overlap_schedule=True`` and single penalties:

- with its default overlap scheduler, a decode step is prepared before the previous step's token reaches the request
  (``sglang/srt/managers/scheduler.py`` ``event_loop_overlap``), so the penalties count one token late: the prompt's
  last token from the second output token on, and never the token just generated
  (``managers/schedule_batch.py`` ``cumulate_penalty_output_tokens``). A presence penalty then lets every token repeat
  once (measured on the tiny model: ``[7, 274, 274, 300, 300, ...]``);
- without it, the counts are exact but the penalties apply in the order of a set of classes
  (``sampling/sampling_batch_info.py`` builds the orchestrator from ``{Frequency, MinNewTokens, Presence,
  Repetition}``; ``penaltylib/orchestrator.py`` ``apply`` iterates it), frequency, repetition, presence in our runs,
  so frequency and presence together with a repetition penalty differ from the additive-then-multiplicative order of
  the overlap path (``_apply_pre_grammar_logits_transforms``), which the transformers engine follows.

SGLang runs here with its tokenizer (``skip_tokenizer_init=False``), so that its stop strings can be compared too; the
engines of this package run it without one, where it refuses stop strings.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from support import SGLANG_CPU, require_sglang

from lit_agentrl.engines.base import output_logprobs
from lit_agentrl.engines.sampling import SamplingParams, apply_penalties
from lit_agentrl.engines.sglang import SGLangEngine

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33]]
SINGLE_PENALTIES = [
    {"frequency_penalty": 0.3},
    {"frequency_penalty": -0.5},
    {"presence_penalty": 2.0},
    {"repetition_penalty": 1.8},
]


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    require_sglang()
    import sglang

    from lit_agentrl.engines.hf import TransformersEngine

    theirs = sglang.Engine(
        model_path=str(tiny_model_dir), random_seed=0, disable_overlap_schedule=True, log_level="warning", **SGLANG_CPU
    )
    ours = TransformersEngine(str(tiny_model_dir))
    yield theirs, ours
    ours.shutdown()
    theirs.shutdown()


def generate(engine, params, prompts=PROMPTS):
    coro = engine.async_generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    loop = getattr(engine, "loop", None)
    return loop.run_until_complete(coro) if loop is not None else asyncio.new_event_loop().run_until_complete(coro)


@pytest.mark.sglang
@pytest.mark.parametrize("penalty", SINGLE_PENALTIES, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_greedy_tokens_and_logprobs_match_sglang(engines, penalty):
    sglang, ours = engines
    params = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True, **penalty}
    for theirs, mine in zip(generate(sglang, params), generate(ours, params)):
        assert mine["output_ids"] == theirs["output_ids"]
        torch.testing.assert_close(
            torch.tensor(output_logprobs(mine)), torch.tensor(output_logprobs(theirs)), atol=1e-4, rtol=0
        )


@pytest.mark.sglang
@pytest.mark.parametrize("penalty", SINGLE_PENALTIES, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_sglang_samples_have_the_logprobs_of_our_penalised_logits(engines, policy_model, penalty):
    sglang, _ = engines
    params = {"temperature": 0.7, "max_new_tokens": 10, "ignore_eos": True, **penalty}
    sp = SamplingParams.of(params)
    for prompt, result in zip(PROMPTS, generate(sglang, params)):
        out = result["output_ids"]
        with torch.no_grad():
            logits = policy_model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
        counts = torch.zeros_like(logits)
        for k in range(1, len(out)):  # row k has counted the tokens generated before it
            counts[k] = counts[k - 1]
            counts[k, out[k - 1]] += 1
        penalised = apply_penalties(logits, [sp] * len(out), counts) / 0.7
        expected = torch.log_softmax(penalised, -1).gather(-1, torch.tensor(out).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(torch.tensor(output_logprobs(result)), expected, atol=1e-4, rtol=0)


@pytest.mark.sglang
def test_stop_strings_end_both_engines_alike(engines, tokenizer):
    sglang, ours = engines
    base = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True, "presence_penalty": 2.0}
    (plain,) = generate(ours, base, prompts=[PROMPTS[0]])
    pieces = [tokenizer.decode([t]) for t in plain["output_ids"]]
    for stop in [pieces[4] + pieces[5], (pieces[4] + pieces[5])[1:], ["not generated", pieces[7]], pieces[3]]:
        (theirs,) = generate(sglang, {**base, "stop": stop}, prompts=[PROMPTS[0]])
        (mine,) = generate(ours, {**base, "stop": stop}, prompts=[PROMPTS[0]])
        assert mine["output_ids"] == theirs["output_ids"] and len(mine["output_ids"]) < 12, stop
        assert mine["meta_info"]["finish_reason"] == theirs["meta_info"]["finish_reason"]
        assert mine["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.sglang
def test_sglang_without_a_tokenizer_refuses_stop_strings():
    require_sglang()
    from sglang.srt.sampling.sampling_params import SamplingParams as SGLangSamplingParams

    # What SGLang's tokenizer manager runs on every request (managers/tokenizer_manager.py 1566); its tokenizer is
    # None under skip_tokenizer_init (639-640), as in the engines of this package.
    with pytest.raises(ValueError, match=r"stop=\['\\n'\] is unavailable when skip_tokenizer_init=True"):
        SGLangSamplingParams(stop=["\n"]).normalize(None)
    SGLangSamplingParams(frequency_penalty=0.5).normalize(None)  # penalties need no tokenizer


class RecordingSGLangEngine(SGLangEngine):
    """The in-process SGLang engine over a stand-in that records what it is asked to generate."""

    def _launch(self, **server_args: Any) -> Any:
        self.sent: list[dict[str, Any]] = []

        async def async_generate(**kwargs: Any) -> dict[str, Any]:
            self.sent.append(kwargs)
            return {"output_ids": [], "meta_info": {}}

        return SimpleNamespace(loop=None, async_generate=async_generate, shutdown=lambda: None)


def test_penalties_pass_through_to_sglang_unchanged(tiny_model_dir):
    engine = RecordingSGLangEngine(str(tiny_model_dir))
    params = {"frequency_penalty": 0.5, "presence_penalty": -0.25, "repetition_penalty": 1.2, "max_new_tokens": 3}
    asyncio.run(engine.async_generate(input_ids=[1, 2], sampling_params=params))
    sent = dict(engine.sent[0]["sampling_params"])
    assert isinstance(sent.pop("sampling_seed"), int) and sent == params  # the engine adds the request's seed
    with pytest.raises(ValueError, match="repetition_penalty"):
        asyncio.run(engine.async_generate(input_ids=[1, 2], sampling_params={"repetition_penalty": 3.0}))
