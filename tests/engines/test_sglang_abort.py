"""Against SGLang 0.5.23 itself (CI's SGLang stage), in process and over HTTP: a cancelled call is aborted in SGLang,
the engine's context length is SGLang's, and what SGLang on CPU cannot do with the per-request seeds.

SGLang runs here one request at a time (``max_running_requests: 1``) with a context of 200 000 tokens and room for
them (``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` lets the tiny model's 4096 be raised): a cancelled request of
150 000 new tokens would hold SGLang for the better part of an hour, so SGLang reporting no running or waiting request,
and the next request being served, show the abort. SGLang's own load report (``/v1/loads``; in process, the same
``TokenizerManager.get_loads``) is polled until it shows that, with a limit only against a hang.

Who aborts: in process, SGLang itself (the cancellation reaches ``TokenizerManager.generate_request``, which aborts the
requests it dispatched); over HTTP, the engine's ``/abort_request`` for each of the call's request ids (its message is
tested in ``test_sglang_requests.py``), where SGLang alone would notice the closed connection within
``SGLANG_REQUEST_STATE_WAIT_TIMEOUT`` (4 s), and only if the connection closes.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
import torch
from support import SGLANG_CPU, require_sglang, running_http_engine

from lit_agentrl.engines import PromptTooLongError

pytestmark = pytest.mark.sglang
CONTEXT = 200_000
ONE_AT_A_TIME = {"max_running_requests": 1, "context_length": CONTEXT, "max_total_tokens": CONTEXT}
LONG = {"max_new_tokens": 150_000, "temperature": 1.0, "ignore_eos": True}
SHORT = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
HANG_S = 300.0  # a wait this long is a hang, not a slow machine


@pytest.fixture(scope="module", params=["sglang", "sglang_http"])
def one_at_a_time(request, tiny_model_dir):
    require_sglang()
    before = os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")
    os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"  # read by SGLang's processes as they start
    try:
        if request.param == "sglang":
            from lit_agentrl.engines.sglang import SGLangEngine

            engine = SGLangEngine(str(tiny_model_dir), seed=0, **{**SGLANG_CPU, **ONE_AT_A_TIME})
            yield engine
            engine.shutdown()
            return
        flags = [f"--{key.replace('_', '-')}={value}" for key, value in ONE_AT_A_TIME.items()]
        with running_http_engine(tiny_model_dir, extra_args=flags) as engine:
            yield engine
    finally:
        if before is None:
            os.environ.pop("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", None)
        else:
            os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = before


def run(engine: Any, coro: Any) -> Any:
    """On the engine's own loop when it has one (in-process SGLang), else on a fresh one."""
    loop = engine.loop
    return loop.run_until_complete(coro) if loop is not None else asyncio.new_event_loop().run_until_complete(coro)


async def load(engine: Any) -> dict[str, int]:
    """SGLang's count of running and waiting requests."""
    if engine.loop is not None:
        (snapshot,) = await engine._engine.tokenizer_manager.get_loads(include=["core"])
        counts = snapshot.to_dict()
    else:
        response = await engine._client().get("/v1/loads", params={"include": "core"})
        (counts,) = response.json()["loads"]
    return {"running": counts["num_running_reqs"], "waiting": counts["num_waiting_reqs"]}


async def until_load(engine: Any, running: int, waiting: int) -> None:
    deadline = time.monotonic() + HANG_S
    while (now := await load(engine)) != {"running": running, "waiting": waiting}:
        assert time.monotonic() < deadline, f"SGLang still reports {now}"
        await asyncio.sleep(0.05)


def test_a_cancelled_call_is_aborted_in_sglang_and_the_next_request_is_served(one_at_a_time):
    async def cancel_then_next() -> dict:
        prompts = [[5, 6, 7], [8, 9]]  # one runs, the other waits its turn
        call = asyncio.ensure_future(one_at_a_time.async_generate(input_ids=prompts, sampling_params=LONG))
        await until_load(one_at_a_time, running=1, waiting=1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await until_load(one_at_a_time, running=0, waiting=0)  # SGLang dropped both
        return await asyncio.wait_for(one_at_a_time.async_generate(input_ids=[9, 10], sampling_params=SHORT), HANG_S)

    result = run(one_at_a_time, cancel_then_next())
    assert len(result["output_ids"]) == SHORT["max_new_tokens"]


def test_the_context_length_is_sglangs_and_a_longer_prompt_never_reaches_it(one_at_a_time):
    """Refused by the engines' front door (SGLang's own refusal is a plain ValueError, over HTTP a 400)."""
    assert one_at_a_time.context_length == CONTEXT
    with pytest.raises(PromptTooLongError, match=f"the prompt has {CONTEXT} tokens"):
        run(one_at_a_time, one_at_a_time.async_generate(input_ids=[5] * CONTEXT, sampling_params=SHORT))
    with pytest.raises(PromptTooLongError, match="max_new_tokens is 4"):
        run(one_at_a_time, one_at_a_time.async_generate(input_ids=[5] * (CONTEXT - 3), sampling_params=SHORT))


def test_each_request_carries_a_seed_sglang_takes(one_at_a_time):
    """Seeds from the full 63-bit range pass SGLang's own check (``sampling_params.py``: an int in [-2**63, 2**63))
    for single requests and ``n`` samples alike."""
    results = run(one_at_a_time, one_at_a_time.async_generate(input_ids=[5, 6], sampling_params={**SHORT, "n": 2}))
    assert [len(r["output_ids"]) for r in results] == [4, 4]


def test_sglang_on_cpu_cannot_sample_from_the_request_seeds(tiny_model_dir):
    """SGLang 0.5.23 reads ``sampling_seed`` only under ``enable_deterministic_inference``
    (``sampling/sampling_batch_info.py``), which its CPU attention backend cannot run: so on CPU a repeated rollout
    cannot sample the same tokens, and ``test_a_repeated_rollout_samples_the_same_tokens`` needs a GPU."""
    require_sglang()
    from lit_agentrl.engines.sglang import SGLangEngine

    with pytest.raises(ValueError, match=r"attention backends are supported for deterministic inference.*torch_native"):
        SGLangEngine(str(tiny_model_dir), enable_deterministic_inference=True, **SGLANG_CPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="SGLang samples from request seeds on GPU backends only")
def test_a_repeated_rollout_samples_the_same_tokens(tiny_model_dir):
    require_sglang()
    from lit_agentrl.context import TrajectoryContext, TrajectoryTag, enter_trajectory
    from lit_agentrl.engines.admission import AdmissionGate
    from lit_agentrl.engines.sglang import SGLangEngine

    engine = SGLangEngine(
        str(tiny_model_dir), enable_deterministic_inference=True, dtype="bfloat16", mem_fraction_static=0.3
    )
    params = {"max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True}

    async def rollout(seed: int) -> list[list[int]]:
        gate = AdmissionGate([[(0, 0), (0, 1)]], capacity=2)

        async def trajectory(key: tuple[int, int]) -> list[int]:
            enter_trajectory(TrajectoryContext(TrajectoryTag(gate, key, seed)))
            first = await engine.async_generate(input_ids=[5, 6, 7], sampling_params=params)
            second = await engine.async_generate(input_ids=[5, 6, 7], sampling_params=params)
            return first["output_ids"] + second["output_ids"]

        return list(await asyncio.gather(*(trajectory(k) for k in [(0, 0), (0, 1)])))

    try:
        first = engine.loop.run_until_complete(rollout(11))
        assert engine.loop.run_until_complete(rollout(11)) == first
        (a, b) = first
        assert a[:16] != a[16:] and a != b  # two turns, two trajectories: different seeds, different samples
    finally:
        engine.shutdown()
