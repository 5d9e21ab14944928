"""Deterministic admission (engines.admission): a rollout's tokens and log-probs do not depend on timing."""

from __future__ import annotations

import asyncio
import random

import pytest
from langchain_core.messages import HumanMessage

from lit_agentrl.agents import AgentGraph, register
from lit_agentrl.engines.admission import AdmissionGate
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.rollout.manager import RolloutManager

JITTER = random.Random()  # unseeded on purpose: every run of the agents sleeps differently


@register("test_jittery_agent")
class JitteryAgent(AgentGraph):
    """Two model turns around random pauses, the second of a row-dependent length: requests arrive at the engine
    in a different order and grouping on every run."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.build_graph()  # the base class's graph: it makes self.chatmodel

    async def run(self, messages, sampling_params, **kwargs):
        await asyncio.sleep(JITTER.uniform(0, 0.03))
        first = await self.chatmodel.ainvoke(messages, sampling_params=sampling_params)
        await asyncio.sleep(JITTER.uniform(0, 0.03))
        again = [*messages, first, HumanMessage("again")]
        params = {**sampling_params, "max_new_tokens": int(kwargs["second_turn_tokens"])}
        second = await self.chatmodel.ainvoke(again, sampling_params=params)
        output = self.convert_agent_graph_output([*again, second])
        output.reward_score = 0.0
        return output


@register("test_hanging_agent")
class HangingAgent(AgentGraph):
    async def run(self, messages, sampling_params, **kwargs):
        await asyncio.sleep(3600)


def rollout(engine: TransformersEngine, tokenizer) -> list[tuple[list[int], list[float]]]:
    rows = [
        {"agent_name": "test_jittery_agent", "prompt": [{"role": "user", "content": f"{i} + {i}"}],
         "ground_truth": "", "second_turn_tokens": 2 + i % 4}
        for i in range(6)
    ]  # fmt: skip
    engine.reseed(1234)
    # Fewer slots than trajectories and a smaller batch than the slots: queued trajectories and queued requests.
    manager = RolloutManager([engine], tokenizer, max_inflight_per_engine=7, check_template_drift=False)
    batch = manager.generate(rows, n_samples=4, sampling_params={"max_new_tokens": 6, "temperature": 1.0})
    manager.close()
    assert batch.stats.num_failed == 0, batch.stats.failure_reasons
    return [(t.all_token_ids, t.response_logprobs) for t in batch.trajectories]


@pytest.fixture(scope="module")
def deterministic_engine(tiny_model_dir):
    engine = TransformersEngine(str(tiny_model_dir), deterministic=True, max_running_requests=5)
    yield engine
    engine.shutdown()


def test_tokens_and_logprobs_do_not_depend_on_timing(deterministic_engine, tokenizer):
    first = rollout(deterministic_engine, tokenizer)
    for _ in range(2):
        assert rollout(deterministic_engine, tokenizer) == first  # bit for bit, log-probs included


def test_a_hanging_trajectory_holds_the_others_until_the_timeout_and_the_rollout_ends(deterministic_engine, tokenizer):
    """The documented price: the engine waits for every running agent, so a hung one stalls the others (which,
    started with it, time out with it); the rollout still ends."""

    rows = [
        {"agent_name": "test_hanging_agent", "prompt": [{"role": "user", "content": "x"}], "ground_truth": ""},
        {"agent_name": "test_jittery_agent", "prompt": [{"role": "user", "content": "y"}], "ground_truth": "",
         "second_turn_tokens": 2},
    ]  # fmt: skip
    manager = RolloutManager([deterministic_engine], tokenizer, trajectory_timeout_s=2.0, check_template_drift=False)
    batch = manager.generate(rows, n_samples=1, sampling_params={"max_new_tokens": 2, "temperature": 1.0})
    manager.close()
    hanging, held = batch.trajectories
    assert hanging.failure_reason == "timeout: trajectory exceeded 2.0s"
    # The other was held until the hang's timeout (alone it takes ~0.05 s): it timed out too, or, when it started a
    # moment later than the hanging one (a loaded machine), finished in the moment its own timeout left it.
    assert held.failure_reason == hanging.failure_reason or (not held.failed and held.seconds > 1.0)


def test_the_gate_is_quiescent_when_every_running_trajectory_waits_and_hands_slots_on_in_key_order():
    async def scenario() -> None:
        gate = AdmissionGate([[(0, 0), (0, 1), (1, 0)]], capacity=2)
        queued = asyncio.ensure_future(gate.acquire((1, 0)))
        await gate.acquire((0, 1))
        await gate.acquire((0, 0))
        gate.submitted((0, 0))
        assert not gate.quiescent()  # (0, 1) still runs its agent
        gate.submitted((0, 1))
        assert gate.quiescent()
        gate.answered((0, 0))
        assert not gate.quiescent()  # answered: its agent runs again
        gate.release((0, 0))
        assert not gate.quiescent() and not queued.done()  # (1, 0) holds the slot, though its task has not run yet
        await queued
        gate.submitted((1, 0))
        assert gate.quiescent()
        gate.release((0, 1))
        gate.release((1, 0))
        assert gate.finished

    asyncio.run(scenario())
