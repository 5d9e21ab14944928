"""Partial rollouts on a real SGLang server (CPU): a weight push while a request generates pauses the server
(``pause_generation``, ``retract``), and the request continues on the new weights, keeping the tokens and log-probs
it already had.

The push zeroes the output head, so every token sampled after it has the log-prob of a uniform choice, -log(V):
the request's log-probs show exactly where the new weights took over.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
import torch
from support import require_sglang, running_http_engine

from lit_agentrl.bridge.weights import sync_weights
from lit_agentrl.engines.base import output_logprobs

pytestmark = pytest.mark.sglang
LONG = {"max_new_tokens": 1500, "temperature": 1.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    require_sglang()
    with running_http_engine(tiny_model_dir) as engine:
        yield engine


def test_a_request_in_flight_continues_on_weights_pushed_mid_generation(engine, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.zero_()  # tied or not, every logit is 0 afterwards
    uniform = -math.log(model.config.vocab_size)

    results: list[dict] = []
    request = threading.Thread(
        target=lambda: results.append(
            asyncio.run(engine.async_generate(input_ids=[5, 6, 7], sampling_params=LONG, return_logprob=True))
        )
    )
    request.start()
    time.sleep(1.0)  # some tokens come from the old weights
    assert request.is_alive(), "the request finished before the push: raise max_new_tokens"
    sync_weights(model, [engine], weight_version=1)
    request.join(timeout=300)

    (result,) = results
    logprobs = output_logprobs(result)
    assert len(result["output_ids"]) == LONG["max_new_tokens"]  # nothing lost to the pause
    new = [abs(lp - uniform) < 1e-4 for lp in logprobs]
    switch = new.index(True)
    assert 0 < switch < len(new), "tokens from both the old and the new weights"
    assert all(new[switch:]), "every token after the push comes from the new weights (no mix)"
    assert not any(new[:switch])
    assert engine.weight_version == 1
