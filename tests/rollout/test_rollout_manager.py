"""The rollout manager: acceptance on the tiny model, failure counting, rewards, bounds and balancing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import ClassVar

import pytest
from support import MATH_SAMPLE_TRAIN

from lit_agentrl.agents import AgentGraph, AgentGraphOutput, register
from lit_agentrl.engines.base import EngineWrapper
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rollout.metrics import RolloutMetrics
from lit_agentrl.types import Trajectory

SAMPLING = {"max_new_tokens": 32, "temperature": 1.0}


def math_rows(n: int) -> list[dict]:
    with open(MATH_SAMPLE_TRAIN) as f:
        return [json.loads(line) for line in f][:n]


def assert_trajectory_invariants(t: Trajectory) -> None:
    p = len(t.prompt_ids)
    assert t.all_token_ids[:p] == t.prompt_ids
    assert len(t.loss_mask) == len(t.all_token_ids) and not any(t.loss_mask[:p])
    assert len(t.response_logprobs) == len(t.all_token_ids) - p
    assert all(lp == 0.0 for lp, m in zip(t.response_logprobs, t.loss_mask[p:]) if not m)
    assert all(lp <= 0.0 for lp in t.response_logprobs)
    assert t.num_generated_tokens > 0


def test_matheval_rollouts_4_prompts_x_4_samples(engine, tokenizer):
    manager = RolloutManager([engine], tokenizer, reward_fn="math")
    batch = manager.generate(math_rows(4), n_samples=4, sampling_params=SAMPLING)
    manager.close()
    assert len(batch.trajectories) == 16
    assert [(t.group, t.sample) for t in batch.trajectories] == [(g, s) for g in range(4) for s in range(4)]
    assert batch.stats.num_failed == 0, batch.stats.failure_reasons
    for t in batch.trajectories:
        assert_trajectory_invariants(t)
        assert t.agent_name == "matheval_agent" and t.reward in (0.0, 1.0)
    assert batch.stats.template_drift == 0
    assert batch.stats.generated_tokens == sum(t.num_generated_tokens for t in batch.trajectories)
    metrics = RolloutMetrics().compute(batch.trajectories, batch.stats.seconds)
    assert {"rollout/reward_mean", "rollout/failed", "rollout/num_turns_mean", "rollout/template_drift"} <= set(metrics)
    assert metrics["rollout/reward_mean"] == pytest.approx(batch.stats.reward_mean)
    assert metrics["rollout/trajectories"] == 16 and metrics["rollout/failed"] == 0


@register("test_raising_agent")
class RaisingAgent(AgentGraph):
    async def run(self, messages, sampling_params, **kwargs):
        raise RuntimeError("agent exploded")


@register("test_sleeping_agent")
class SleepingAgent(AgentGraph):
    async def run(self, messages, sampling_params, **kwargs):
        await asyncio.sleep(30)


@register("test_bad_output_agent")
class BadOutputAgent(AgentGraph):
    async def run(self, messages, sampling_params, **kwargs):
        return AgentGraphOutput(str_output="", prompt_ids=[1, 2], all_token_ids=[1, 2, 3], loss_mask=[0, 1])


@register("test_self_scoring_agent")
class SelfScoringAgent(AgentGraph):
    """One real model turn; scores itself from a row field, and records the kwargs it saw."""

    seen: ClassVar[list[dict]] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.build_graph()

    async def run(self, messages, sampling_params, **kwargs):
        type(self).seen.append(kwargs)
        message = await self.chatmodel.ainvoke(messages, sampling_params=sampling_params)
        output = self.convert_agent_graph_output([*messages, message])
        output.reward_score = float(kwargs["bonus"])
        return output


def row(agent: str, **extra) -> dict:
    return {"agent_name": agent, "prompt": [{"role": "user", "content": "2+2?"}], "ground_truth": "4", **extra}


def test_faulty_trajectories_are_counted_and_the_batch_survives(engine, tokenizer):
    rows = [
        row("test_raising_agent"),
        row("test_sleeping_agent"),
        row("test_bad_output_agent"),
        row("test_self_scoring_agent", bonus=0.5),
        row("not_registered_agent"),
    ]
    # Generous: the real model turn of test_self_scoring_agent must finish in time even on a loaded machine.
    manager = RolloutManager([engine], tokenizer, trajectory_timeout_s=10.0)
    batch = manager.generate(rows, n_samples=2, sampling_params=SAMPLING)
    manager.close()
    by_agent = {t.agent_name: t for t in batch.trajectories}
    assert batch.stats.num_failed == 8 and batch.stats.num_trajectories == 10
    assert by_agent["test_raising_agent"].failure_reason == "RuntimeError: agent exploded"
    assert by_agent["test_sleeping_agent"].failure_reason.startswith("timeout")
    assert "loss_mask" in by_agent["test_bad_output_agent"].failure_reason
    assert "unknown agent_name" in by_agent["not_registered_agent"].failure_reason
    for t in batch.trajectories:
        if t.failed:
            assert t.loss_mask == [] and t.all_token_ids == []
    assert sum(batch.stats.failure_reasons.values()) == 8
    ok = by_agent["test_self_scoring_agent"]
    assert not ok.failed and ok.reward == 0.5 and batch.stats.reward_mean == 0.5


def test_every_row_field_reaches_run(engine, tokenizer):
    SelfScoringAgent.seen.clear()
    rows = [row("test_self_scoring_agent", bonus=1, reward_model={"ground_truth": "4"}, extra_info={"k": 1})]
    RolloutManager([engine], tokenizer).generate(rows, n_samples=1, sampling_params=SAMPLING)
    (kwargs,) = SelfScoringAgent.seen
    assert kwargs["bonus"] == 1 and kwargs["extra_info"] == {"k": 1} and kwargs["ground_truth"] == "4"
    assert kwargs["agent_name"] == "test_self_scoring_agent" and "prompt" not in kwargs


def test_missing_reward_is_a_counted_failure(engine, tokenizer):
    rows = [{"agent_name": "single_turn", "prompt": [{"role": "user", "content": "hi"}], "data_source": "chitchat"}]
    batch = RolloutManager([engine], tokenizer).generate(rows, n_samples=2, sampling_params=SAMPLING)
    assert batch.stats.num_failed == 2
    assert "no reward" in batch.trajectories[0].failure_reason


def test_invalid_sampling_params_fail_before_any_trajectory(engine, tokenizer):
    manager = RolloutManager([engine], tokenizer)
    with pytest.raises(ValueError, match="temperature"):
        manager.generate([row("test_raising_agent")], n_samples=1, sampling_params={"temperature": -1})


class CountingEngine(EngineWrapper):
    """Delegates to a real engine while recording the peak number of concurrent requests."""

    def __init__(self, inner: TransformersEngine) -> None:
        self.inner, self.active, self.peak, self.requests = inner, 0, 0, 0

    async def async_generate(self, **kwargs):
        self.active += 1
        self.requests += 1
        self.peak = max(self.peak, self.active)
        try:
            return await self.inner.async_generate(**kwargs)
        finally:
            self.active -= 1


def test_inflight_bound_and_balancing_across_engines(engine, tokenizer):
    engines = [CountingEngine(engine), CountingEngine(engine)]
    manager = RolloutManager(engines, tokenizer, max_inflight_per_engine=3, reward_fn="math")
    batch = manager.generate(math_rows(4), n_samples=4, sampling_params={**SAMPLING, "max_new_tokens": 8})
    assert batch.stats.num_failed == 0
    assert all(e.peak <= 3 for e in engines)
    # 16 single-or-multi-turn trajectories split between two: each engine starts 3 and takes refills as it frees
    # slots, so the split depends on which finishes first (8/8 is typical, 9/7 happens); none goes begging
    assert sum(e.requests for e in engines) >= 16 and all(e.requests >= 4 for e in engines)


@pytest.mark.parametrize(
    "kwargs, fragment", [({"max_inflight_per_engine": 0}, "max_inflight"), ({"trajectory_timeout_s": 0}, "timeout")]
)
def test_bad_manager_settings_are_refused(engine, tokenizer, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        RolloutManager([engine], tokenizer, **kwargs)


@register("test_agent_without_sampling_params")
class ForgetsSamplingParams(AgentGraph):
    """Calls its ChatModel without sampling_params, as a hand-written agent easily does."""

    async def run(self, messages, sampling_params, **kwargs):
        self.build_graph()
        message = await self.chatmodel.ainvoke(messages)
        return self.convert_agent_graph_output({"messages": [*messages, message]})


def test_a_chat_model_called_without_sampling_params_uses_the_runs_never_the_engines(engine, tokenizer):
    rows = [{**row, "agent_name": "test_agent_without_sampling_params"} for row in math_rows(2)]
    manager = RolloutManager([engine], tokenizer, reward_fn="math")
    batch = manager.generate(rows, n_samples=2, sampling_params={"max_new_tokens": 3, "temperature": 1.0})
    manager.close()
    assert not any(t.failed for t in batch.trajectories), [t.failure_reason for t in batch.trajectories]
    assert all(t.num_generated_tokens <= 3 for t in batch.trajectories)  # the run's limit, not the engine's 128
    chat = ForgetsSamplingParams("x", None, engine, tokenizer).make_chat_model()
    with pytest.raises(ValueError, match="without sampling_params, outside a rollout"):
        asyncio.run(chat.ainvoke(rows[0]["prompt"]))


def test_failed_trajectories_are_reported_every_step_with_each_reasons_traceback_once(engine, tokenizer, caplog):
    from lit_agentrl.rollout.health import RolloutHealth

    rows = [{**math_rows(1)[0], "agent_name": "test_raising_agent"}]
    manager = RolloutManager([engine], tokenizer, reward_fn="math")
    batch = manager.generate(rows, n_samples=2, sampling_params=SAMPLING)
    manager.close()
    failed = batch.trajectories[0]
    assert all(t.failed for t in batch.trajectories)
    assert "RuntimeError: agent exploded" in failed.failure_traceback
    assert failed.failure_traceback.rstrip().endswith(f"{__file__}:{RaisingAgent.run.__code__.co_firstlineno + 1}")
    metrics = {"rollout/failed": 2.0, "rollout/trajectories": 2.0}
    health = RolloutHealth()
    with caplog.at_level("WARNING", logger="lit_agentrl.rollout.health"):
        health.report_failures(7, batch.trajectories, metrics)
    assert "step 7: 2 of 2 trajectories failed (left out of the loss): 2 x RuntimeError: agent exploded" in caplog.text
    assert "first traceback of 'RuntimeError: agent exploded':" in caplog.text
    assert "in agent 'test_raising_agent'" in caplog.text
    # The same reason at a later step: counted again, its traceback not repeated but pointed to.
    caplog.clear()
    with caplog.at_level("WARNING", logger="lit_agentrl.rollout.health"):
        health.report_failures(8, batch.trajectories, metrics)
    assert "step 8: 2 of 2 trajectories failed (left out of the loss): 2 x RuntimeError: agent exploded" in caplog.text
    assert "their tracebacks are in the report of step 7" in caplog.text and "Traceback" not in caplog.text
    # A new reason beside it gets its own traceback.
    caplog.clear()
    other = dataclasses.replace(failed, failure_reason="ValueError: new", failure_traceback="Traceback: the new one")
    with caplog.at_level("WARNING", logger="lit_agentrl.rollout.health"):
        health.report_failures(9, [failed, other], metrics)
    assert "1 x RuntimeError: agent exploded; 1 x ValueError: new" in caplog.text
    assert "first traceback of 'ValueError: new':\nTraceback: the new one" in caplog.text
    assert "first traceback of 'RuntimeError" not in caplog.text


def test_a_trajectory_has_a_time_limit_unless_one_is_refused_on_purpose(engine, tokenizer):
    from lit_agentrl.callbacks import RolloutCallback
    from lit_agentrl.config.rollout import Health
    from lit_agentrl.rollout.manager import DEFAULT_TRAJECTORY_TIMEOUT_S

    assert RolloutManager([engine], tokenizer).trajectory_timeout_s == DEFAULT_TRAJECTORY_TIMEOUT_S == 1800.0
    assert RolloutCallback().settings.health.trajectory_timeout_s == DEFAULT_TRAJECTORY_TIMEOUT_S
    assert RolloutCallback(health=Health(trajectory_timeout_s=None)).settings.health.trajectory_timeout_s is None


def test_template_drift_is_logged_only_where_it_is_measured():
    trajectory = Trajectory(0, 0, "a", prompt_ids=[1], all_token_ids=[1, 2], loss_mask=[0, 1], reward=1.0)
    trajectory.response_logprobs = [-0.5]
    assert "rollout/template_drift" not in RolloutMetrics(measures_drift=False).compute([trajectory], 1.0)
    trajectory.extra_fields["template_drift"] = 3
    assert RolloutMetrics().compute([trajectory], 1.0)["rollout/template_drift"] == 3.0
