"""Agents written with other frameworks train unchanged through the gateway: the OpenAI Agents SDK (its Chat
Completions model) and smolagents (a synchronous client, run in a thread). Each call's tokens are the engine's."""

from __future__ import annotations

import asyncio

import openai
from gateway_support import ROW, Recording, rollout
from support import tool_call_text

from lit_agentrl.agents import register_openai_agent
from lit_agentrl.rewards.registry import register_reward


def _contains_five(text: str, truth: object, **_: object) -> float:
    return float("5" in text)


register_reward("gateway_frameworks_five")(_contains_five)


@register_openai_agent("gateway_agents_sdk")
async def agents_sdk(client: openai.AsyncOpenAI, row: dict, cfg) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = Agent(name="calculator", instructions="Use the tool.", tools=[add], model=model)
    await Runner.run(agent, row["messages"], run_config=RunConfig(tracing_disabled=True))


@register_openai_agent("gateway_smolagents")
async def smol(client: openai.AsyncOpenAI, row: dict, cfg) -> None:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first integer.
            b: the second integer.
        """
        return a + b

    model = OpenAIServerModel(model_id="policy", api_base=str(client.base_url), api_key=client.api_key)
    agent = ToolCallingAgent(tools=[add], model=model, max_steps=3, verbosity_level=0)
    # smolagents' client is synchronous: in a thread, so the gateway (on this event loop) can answer it.
    await asyncio.to_thread(agent.run, row["messages"][-1]["content"])


def _check_token_exact(engine: Recording, trajectory) -> None:
    assert not trajectory.failed, trajectory.failure_reason
    sequences = trajectory.sequences
    trained = sorted(t for s in sequences for t, m in zip(s.all_token_ids, s.loss_mask) if m)
    assert trained == sorted(t for reply in engine.outputs for t in reply)
    for request in engine.inputs:  # each request is a prefix of one of the trajectory's sequences
        assert any(s.all_token_ids[: len(request)] == request for s in sequences)
    assert trajectory.extra_fields["template_drift"] == 0


def test_the_openai_agents_sdk_trains_unchanged(scripted_engine_factory, tokenizer):
    engine = Recording(scripted_engine_factory([tool_call_text("add", {"a": 2, "b": 3}), "The sum is 5."]))
    row = {**ROW, "agent_name": "gateway_agents_sdk", "data_source": "gateway_frameworks_five"}
    (trajectory,) = rollout(engine, tokenizer, row).trajectories
    _check_token_exact(engine, trajectory)
    assert trajectory.reward == 1.0 and trajectory.num_tool_calls == 1 and not trajectory.other_sequences
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(trajectory.all_token_ids)


def test_smolagents_trains_unchanged(scripted_engine_factory, tokenizer):
    replies = [tool_call_text("add", {"a": 2, "b": 3}), tool_call_text("final_answer", {"answer": "5"})]
    engine = Recording(scripted_engine_factory(replies))
    row = {**ROW, "agent_name": "gateway_smolagents", "data_source": "gateway_frameworks_five"}
    (trajectory,) = rollout(engine, tokenizer, row).trajectories
    _check_token_exact(engine, trajectory)
    assert trajectory.num_model_turns == 2 and trajectory.num_tool_calls == 2
