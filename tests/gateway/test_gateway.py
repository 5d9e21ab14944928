"""The OpenAI-compatible gateway: agents written with the official ``openai`` client train on the exact tokens the
engine sampled, through the rollout manager, with tool calls, multi-turn appends and rewritten histories."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import openai
import pytest
from gateway_support import ADD_TOOL, ROW, SAMPLING, Recording, rollout
from support import tool_call_text

from lit_agentrl.agents import AgentResult, register_openai_agent
from lit_agentrl.agents import gateway as gateway_module


@register_openai_agent("gateway_calculator")
async def calculator(client: openai.AsyncOpenAI, row: dict, cfg) -> AgentResult:
    """A plain OpenAI tool loop: call the model, run its tool calls, feed the results back, until it answers."""
    messages = list(row["messages"])
    for _ in range(4):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return AgentResult(reward=float(row["ground_truth"] in (message.content or "")), metrics={"turns": 1.0})
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    return AgentResult(reward=0.0)


@register_openai_agent("gateway_rewriter")
async def rewriter(client: openai.AsyncOpenAI, row: dict, cfg) -> float:
    """Asks once, then starts over with a summary of its own instead of the model's reply (a compacted history)."""
    first = await client.chat.completions.create(model="policy", messages=row["messages"])
    compacted = [{"role": "user", "content": f"Earlier you said: {first.choices[0].message.content[:10]}. Go on."}]
    await client.chat.completions.create(model="policy", messages=compacted)
    return 1.0


def test_an_openai_tool_loop_trains_on_the_sampled_tokens(scripted_engine_factory, tokenizer):
    engine = Recording(
        scripted_engine_factory([tool_call_text("add", {"a": 2, "b": 3}), "The sum is 5.", "The sum is 5."])
    )
    batch = rollout(engine, tokenizer, ROW)
    (trajectory,) = batch.trajectories
    assert not trajectory.failed, trajectory.failure_reason
    assert trajectory.reward == 1.0 and trajectory.num_model_turns == 2 and trajectory.num_tool_calls == 1
    ids, mask, prompt = trajectory.all_token_ids, trajectory.loss_mask, len(trajectory.prompt_ids)
    # Trained tokens are exactly the sampled ones, with their log-probs; each request was the trajectory so far.
    assert [t for t, m in zip(ids, mask) if m] == [t for reply in engine.outputs for t in reply]
    sampled = [lp for lp, m in zip(trajectory.response_logprobs, mask[prompt:]) if m]
    assert sampled == pytest.approx([lp for reply in engine.logprobs for lp in reply])
    for request in engine.inputs:
        assert ids[: len(request)] == request
    expected_prompt = tokenizer.apply_chat_template(
        ROW["prompt"], tools=[ADD_TOOL], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert trajectory.prompt_ids == tokenizer.encode(expected_prompt, add_special_tokens=False)
    # The tool's answer went in as the template renders a tool turn, and the conversation is kept for the log.
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(ids[prompt:])
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert trajectory.extra_fields["metrics"] == {"turns": 1.0, "refused_calls": 0.0}
    assert trajectory.extra_fields["template_drift"] == 0  # the tool turn appended as the template renders it
    assert not gateway_module._gateways  # the manager's close stopped the gateway its agents started


def test_a_rewritten_history_is_a_second_sequence_of_the_trajectory(scripted_engine_factory, tokenizer):
    engine = Recording(scripted_engine_factory(["I think it is 5.", "Yes, 5."]))
    batch = rollout(engine, tokenizer, {**ROW, "agent_name": "gateway_rewriter"})
    (trajectory,) = batch.trajectories
    assert not trajectory.failed, trajectory.failure_reason
    # The second call was rendered from the messages as sent, not appended to the first conversation: it is the
    # main sequence (that of the latest reply), the first conversation another, each with its sampled tokens.
    first, second = engine.inputs
    assert second[: len(first)] != first and "Earlier you said" in tokenizer.decode(second)
    (other,) = trajectory.other_sequences
    assert trajectory.prompt_ids == second and other.prompt_ids == first
    assert [t for t, m in zip(trajectory.all_token_ids, trajectory.loss_mask) if m] == engine.outputs[1]
    assert [t for t, m in zip(other.all_token_ids, other.loss_mask) if m] == engine.outputs[0]
    assert [lp for lp, m in zip(other.response_logprobs, other.loss_mask[len(first) :]) if m] == pytest.approx(
        engine.logprobs[0]
    )
    assert trajectory.num_model_turns == 2 and other.reward is None
    assert trajectory.num_generated_tokens == len(engine.outputs[0]) + len(engine.outputs[1])


def test_the_official_client_gets_errors_streams_and_models(scripted_engine_factory, tokenizer):
    from lit_agentrl.agents.chat_model import ChatModel
    from lit_agentrl.agents.gateway import Gateway
    from lit_agentrl.context import TrajectoryContext

    engine = scripted_engine_factory(["Hello there.", "Hello there."])
    chat = ChatModel(model="policy", llm=engine, tokenizer=tokenizer)

    async def main():
        gateway = Gateway(chat)
        await gateway.start()
        session = gateway.open_session(TrajectoryContext(sampling_params=SAMPLING))
        client = openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key="unused", max_retries=0)
        keyed = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gateway.port}/v1", api_key=session.id, max_retries=0)
        stranger = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gateway.port}/v1", api_key="nobody", max_retries=0)
        try:
            models = await client.models.list()
            with pytest.raises(openai.AuthenticationError, match="unknown or finished trajectory"):
                await stranger.chat.completions.create(model="policy", messages=ROW["prompt"])
            with pytest.raises(openai.BadRequestError, match="n must be an integer from 1 to 64"):
                await client.chat.completions.create(model="policy", messages=ROW["prompt"], n=0)
            image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
            with pytest.raises(openai.BadRequestError, match=r"messages\[0\].content\[1\] is a 'image_url' part"):
                content = [{"type": "text", "text": "What is this?"}, image]
                await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": content}])
            with pytest.raises(openai.BadRequestError, match="role"):
                await client.chat.completions.create(model="policy", messages=[{"role": "robot", "content": "x"}])
            plain = await keyed.chat.completions.create(model="policy", messages=ROW["prompt"], logprobs=True)
            stream = await client.chat.completions.create(
                model="policy", messages=ROW["prompt"], stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk async for chunk in stream]
        finally:
            for c in (client, keyed, stranger):
                await c.close()
            await gateway.stop()
        return models, plain, chunks, session

    models, plain, chunks, session = asyncio.run(main())
    assert [m.id for m in models.data] == ["policy"]
    assert plain.choices[0].message.content == "Hello there." and plain.choices[0].finish_reason == "stop"
    assert len(plain.choices[0].logprobs.content) == plain.usage.completion_tokens
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == "Hello there." and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert len(session.samples) == 2  # the same first message twice: the second call restarts, as sent


@register_openai_agent("gateway_react")
async def react(client: openai.AsyncOpenAI, row: dict, cfg) -> None:
    """LangGraph's prebuilt ReAct agent over LangChain's ChatOpenAI, pointed at the gateway: unchanged code."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    agent = create_react_agent(model, [add])
    await agent.ainvoke({"messages": row["messages"]})
    return None  # the row's reward function scores the last reply


def _contains_answer(text: str, truth: object, **_: object) -> float:
    return float(str(truth) in text)


def test_langgraphs_prebuilt_react_agent_over_chatopenai_trains_unchanged(scripted_engine_factory, tokenizer):
    from lit_agentrl.rewards.registry import register_reward

    register_reward("gateway_contains_answer")(_contains_answer)
    engine = Recording(scripted_engine_factory([tool_call_text("add", {"a": 2, "b": 3}), "It is 5."]))
    row = {**ROW, "agent_name": "gateway_react", "data_source": "gateway_contains_answer"}
    (trajectory,) = rollout(engine, tokenizer, row).trajectories
    assert not trajectory.failed, trajectory.failure_reason
    assert trajectory.reward == 1.0 and trajectory.num_model_turns == 2 and trajectory.num_tool_calls == 1
    mask = trajectory.loss_mask
    assert [t for t, m in zip(trajectory.all_token_ids, mask) if m] == [t for r in engine.outputs for t in r]
    for request in engine.inputs:  # the second call appended the tool's answer to the first call's tokens
        assert trajectory.all_token_ids[: len(request)] == request


def test_an_external_program_trains_through_the_gateway(scripted_engine_factory, tokenizer, tmp_path):
    script = Path(__file__).with_name("command_agent.py")
    cfg = tmp_path / "command.yaml"
    cfg.write_text(f"command: [{sys.executable!r}, {str(script)!r}]\n")
    engine = Recording(scripted_engine_factory(["It is 5.", "It is 7."]))
    row = {**ROW, "agent_name": "openai_command", "agent_cfg_path": str(cfg)}
    right, wrong = rollout(engine, tokenizer, row, n=2).trajectories
    assert not right.failed and not wrong.failed, (right.failure_reason, wrong.failure_reason)
    assert sorted([right.reward, wrong.reward]) == [0.0, 1.0]
    assert sorted(t.extra_fields["metrics"]["chars"] for t in (right, wrong)) == [8.0, 8.0]
    for trajectory in (right, wrong):
        generated = [t for t, m in zip(trajectory.all_token_ids, trajectory.loss_mask) if m]
        assert generated in engine.outputs


def test_a_failing_program_fails_its_trajectory_with_its_stderr(scripted_engine_factory, tokenizer, tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text(f"command: [{sys.executable!r}, '-c', 'import sys; sys.exit(\"no model for me\")']\n")
    row = {**ROW, "agent_name": "openai_command", "agent_cfg_path": str(cfg)}
    (trajectory,) = rollout(scripted_engine_factory([]), tokenizer, row).trajectories
    assert trajectory.failed and "exited with status 1: no model for me" in trajectory.failure_reason
