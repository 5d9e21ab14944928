"""A request whose caller stops waiting (a trajectory's timeout cancels its task) is aborted where it runs: the
transformers engine drops it from its queue or running batch before its next step, and the engine process does the
same on an ``abort`` message from its parent.

The engines here run one request at a time (``max_running_requests=1``) with room for 100 000 new tokens: the next
request can start only once the cancelled one has left the batch, so its finishing at all shows the abort (without
it, it would wait for 100 000 decode steps). Every wait is on an event, with a limit only against a hang.
"""

from __future__ import annotations

import asyncio

import pytest

from lit_agentrl.context import TrajectoryContext, TrajectoryTag, enter_trajectory
from lit_agentrl.engines.admission import AdmissionGate
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.engines.process import ProcessEngine

HUGE = {"temperature": 1.0, "max_new_tokens": 100_000, "ignore_eos": True}
SHORT = {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}
ONE_AT_A_TIME = {"max_running_requests": 1, "context_length": 200_000}
HANG_S = 120.0  # a wait this long is a hang, not a slow machine


async def waited(call, *args) -> None:
    """Run one of the engine's blocking waits off the loop; it must come true."""
    assert await asyncio.to_thread(call, *args, HANG_S)


async def cancel_then_next(engine, prompts, aborted_before: int = 0) -> dict:
    """Start ``prompts`` (huge requests), cancel them once decoding, then run a short request and return it."""
    running = asyncio.ensure_future(engine.async_generate(input_ids=prompts, sampling_params=HUGE))
    await waited(engine.wait_for_sampled_tokens, engine.sampled_tokens + 3)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await waited(
        engine.wait_for_aborted_requests, aborted_before + (len(prompts) if isinstance(prompts[0], list) else 1)
    )
    return await asyncio.wait_for(engine.async_generate(input_ids=[9, 10], sampling_params=SHORT), HANG_S)


@pytest.fixture
def one_at_a_time(tiny_model_dir):
    engine = TransformersEngine(str(tiny_model_dir), **ONE_AT_A_TIME)
    yield engine
    engine.shutdown()


def test_a_cancelled_request_leaves_the_running_batch_and_the_next_one_runs(one_at_a_time):
    result = asyncio.run(cancel_then_next(one_at_a_time, [5, 6, 7]))
    assert len(result["output_ids"]) == SHORT["max_new_tokens"]
    assert one_at_a_time.aborted_requests == 1 and one_at_a_time.running_requests == 0


def test_a_cancelled_batch_aborts_every_prompt_running_or_queued(one_at_a_time):
    """Two prompts in one call: the first runs, the second waits in the queue; both are aborted."""
    result = asyncio.run(cancel_then_next(one_at_a_time, [[5, 6, 7], [8, 9]]))
    assert len(result["output_ids"]) == SHORT["max_new_tokens"]
    assert one_at_a_time.aborted_requests == 2 and one_at_a_time.running_requests == 0


def test_an_aborted_request_no_longer_counts_as_waiting_on_the_engine(one_at_a_time):
    """The admission gate's books (deterministic admission waits for every running trajectory to wait on the engine):
    the aborted request's trajectory runs again, as after an answer."""
    gate = AdmissionGate([[(0, 0)]], capacity=1)

    async def trajectory() -> None:
        enter_trajectory(TrajectoryContext(TrajectoryTag(gate, (0, 0), seed=1)))
        await one_at_a_time.async_generate(input_ids=[5, 6, 7], sampling_params=HUGE)

    async def cancelled() -> None:
        task = asyncio.ensure_future(trajectory())
        await waited(one_at_a_time.wait_for_sampled_tokens, 3)
        assert gate.quiescent()  # its trajectory waits on the engine
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await waited(one_at_a_time.wait_for_aborted_requests, 1)

    asyncio.run(cancelled())
    assert not gate.quiescent()


def test_the_engine_process_aborts_a_cancelled_request(tiny_model_dir):
    engine = ProcessEngine(str(tiny_model_dir), threads=1, **ONE_AT_A_TIME)
    try:
        first = asyncio.run(cancel_then_next(engine, [5, 6, 7]))
        assert len(first["output_ids"]) == SHORT["max_new_tokens"]
        assert engine.wait_for_aborted_requests(1, timeout=0)  # exactly as many as were cancelled: one, then three
        batch = asyncio.run(cancel_then_next(engine, [[5, 6, 7], [8, 9]], aborted_before=1))
        assert len(batch["output_ids"]) == SHORT["max_new_tokens"]
        assert engine.wait_for_aborted_requests(3, timeout=0) and not engine.wait_for_aborted_requests(4, timeout=0)
    finally:
        engine.shutdown()
