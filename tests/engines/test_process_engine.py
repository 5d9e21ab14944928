"""The transformers engine in a process of its own (``engine: transformers_process``): what the in-process engine
samples, weight versions through partial updates, and a dead or misconfigured process failing loudly.

The engine API both share is tested by ``test_engine_contract.py``."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch
from support import torch_threads

from lit_agentrl.context import TrajectoryContext, TrajectoryTag, enter_trajectory
from lit_agentrl.engines.admission import AdmissionGate
from lit_agentrl.engines.base import output_logprobs
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.engines.process import ProcessEngine
from lit_agentrl.errors import UserInputError

SAMPLED = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True}
LONG = {"temperature": 1.0, "max_new_tokens": 400, "ignore_eos": True}
EVENT_TIMEOUT_S = 120.0  # how long a test waits for the engine to reach a token count: a hang, not a slow machine


@pytest.fixture(scope="module")
def process_engine(tiny_model_dir):
    engine = ProcessEngine(str(tiny_model_dir), seed=3, threads=1)
    yield engine
    engine.shutdown()


async def tagged_rollout(engine, keys, seed):
    """Each key's trajectory asks twice, in a task of its own as a rollout manager's, one trajectory at a time (so
    every request is decoded alone, and log-probs compare bit for bit)."""
    gate = AdmissionGate([keys], capacity=len(keys))

    async def trajectory(key):
        enter_trajectory(TrajectoryContext(TrajectoryTag(gate, key, seed)))
        first = await engine.async_generate(input_ids=[5, 6, 7, key[0] + 8], sampling_params=SAMPLED)
        second = await engine.async_generate(
            input_ids=[9, *first["output_ids"]], sampling_params=SAMPLED, return_logprob=True
        )
        return first["output_ids"], second["output_ids"], output_logprobs(second), gate.versions(key)

    return [await asyncio.create_task(trajectory(k)) for k in keys]


async def wait_for_tokens(engine: ProcessEngine, count: int) -> None:
    """Until the engine has sampled ``count`` tokens in all: the request under test is then decoding."""
    assert await asyncio.to_thread(engine.wait_for_sampled_tokens, count, EVENT_TIMEOUT_S)


def test_samples_what_the_in_process_engine_samples(process_engine, tiny_model_dir):
    local = TransformersEngine(str(tiny_model_dir), seed=3)
    try:
        keys = [(0, 0), (0, 1), (1, 0)]
        ours = asyncio.run(tagged_rollout(process_engine, keys, seed=11))
        with torch_threads(1):  # the engine process's count: the bits of a matmul depend on it
            theirs = asyncio.run(tagged_rollout(local, keys, seed=11))
        assert [o[:3] for o in ours] == [t[:3] for t in theirs]
        assert all(o[3] == (0, 0) for o in ours)  # the engine's weight version reached the trajectories
        # Untagged requests: the n-th since a reseed samples from (seed, n) in both.
        process_engine.reseed(5)
        local.reseed(5)
        params = {**SAMPLED, "n": 2}
        ours_untagged = asyncio.run(process_engine.async_generate(input_ids=[4, 5], sampling_params=params))
        with torch_threads(1):
            theirs_untagged = asyncio.run(local.async_generate(input_ids=[4, 5], sampling_params=params))
        assert [r["output_ids"] for r in ours_untagged] == [r["output_ids"] for r in theirs_untagged]
    finally:
        local.shutdown()


def test_a_weight_update_lands_between_steps_of_running_requests(process_engine, policy_model):
    async def update_while_generating():
        before = process_engine.sampled_tokens  # exact: no request is running
        running = asyncio.ensure_future(
            process_engine.async_generate(input_ids=[5, 6, 7], sampling_params=LONG, return_logprob=True)
        )
        await wait_for_tokens(process_engine, before + 10)  # its first 10 tokens, on the old weights
        process_engine.begin_weight_update()
        assert not running.done()
        scaled = [(n, p.detach() * 1.01) for n, p in policy_model.named_parameters()]
        ok, message = process_engine.update_weights_from_tensor(scaled, flush_cache=False)
        process_engine.weight_version = 1
        assert process_engine.flush_cache()
        process_engine.end_weight_update()
        return ok, message, await running

    ok, message, result = asyncio.run(update_while_generating())
    assert ok, message
    assert result["meta_info"]["weight_version"] == 1 and len(result["output_ids"]) == LONG["max_new_tokens"]
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(process_engine.get_weights_by_name(name), policy_model.get_parameter(name).detach() * 1.01)
    assert process_engine.busy_seconds > 0

    ok, message = process_engine.update_weights_from_tensor([("model.nope.weight", torch.zeros(2))])
    assert not ok and "unknown weight 'model.nope.weight'" in message
    process_engine.update_weights_from_tensor(policy_model.named_parameters())  # back, for the other tests
    process_engine.weight_version = 0


def test_a_dead_engine_process_fails_the_requests_in_flight_and_every_later_call(tiny_model_dir):
    engine = ProcessEngine(str(tiny_model_dir), threads=1)

    async def killed_mid_request():
        running = asyncio.ensure_future(engine.async_generate(input_ids=[5, 6], sampling_params=LONG))
        await wait_for_tokens(engine, 1)
        os.kill(engine._process.pid, signal.SIGKILL)
        return await running

    with pytest.raises(RuntimeError, match=r"the engine process died \(exit code -9\)"):
        asyncio.run(killed_mid_request())
    with pytest.raises(RuntimeError, match="exit code -9"):
        engine.reseed(1)
    engine.shutdown()  # still returns


def test_a_bad_setting_is_raised_in_the_callers_process(tiny_model_dir, tmp_path):
    with pytest.raises(UserInputError, match="max_running_requests must be >= 1"):
        ProcessEngine(str(tiny_model_dir), max_running_requests=0)
    with pytest.raises(UserInputError, match="deterministic: true needs the engine in the trainer's process"):
        ProcessEngine(str(tiny_model_dir), deterministic=True)
    with pytest.raises(OSError):
        ProcessEngine(str(tmp_path / "no-model-here"))
