"""Trajectories whose calls form several token sequences: a sub-agent's fresh context, the choices of ``n > 1``,
rewards per sequence; and ``tool_choice``. Every sampled token is trained exactly once."""

from __future__ import annotations

import json
import logging
from collections import Counter

import openai
import pytest
from gateway_support import ADD_TOOL, ROW, Recording, rollout
from support import tool_call_text

from lit_agentrl.agents import AgentResult, register_openai_agent
from lit_agentrl.training.batching import prepare_samples
from lit_agentrl.types import Trajectory


def generated(sequence) -> list[int]:
    return [t for t, m in zip(sequence.all_token_ids, sequence.loss_mask) if m]


def trained_tokens(trajectory: Trajectory) -> Counter:
    return Counter(t for s in trajectory.sequences for t in generated(s))


@register_openai_agent("gateway_with_subagent")
async def with_subagent(client: openai.AsyncOpenAI, row: dict, cfg) -> AgentResult:
    """Asks, lets a sub-agent check the answer in a fresh context, then goes on with its own conversation; the
    sub-agent's reply gets a reward of its own."""
    messages = list(row["messages"])
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    check = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Is 5 right? Say yes or no."}]
    )
    messages.append({"role": "user", "content": f"A checker says: {check.choices[0].message.content}"})
    await client.chat.completions.create(model="policy", messages=messages)
    return AgentResult(reward=1.0, sequence_rewards={check.id: 0.25})


def test_a_subagent_is_a_sequence_of_its_own_and_the_main_conversation_stays_token_exact(
    scripted_engine_factory, tokenizer
):
    engine = Recording(scripted_engine_factory(["It is 5.", "yes", "So 5."]))
    (trajectory,) = rollout(engine, tokenizer, {**ROW, "agent_name": "gateway_with_subagent"}).trajectories
    assert not trajectory.failed, trajectory.failure_reason
    main_first, sub, main_again = engine.inputs
    # The main agent's third call continued its first conversation token-exactly, across the sub-agent's call.
    assert main_again[: len(main_first) + len(engine.outputs[0])] == main_first + engine.outputs[0]
    assert trajectory.all_token_ids[: len(main_again)] == main_again
    assert generated(trajectory) == engine.outputs[0] + engine.outputs[2]
    (subagent,) = trajectory.other_sequences
    assert subagent.prompt_ids == sub and generated(subagent) == engine.outputs[1] and subagent.reward == 0.25
    assert trajectory.num_model_turns == 3 and trajectory.reward == 1.0
    assert trajectory.extra_fields["template_drift"] == 0  # both sequences, rendered whole, equal their ids


def _trajectory(group: int, reward: float, *sequence_rewards: float | None) -> Trajectory:
    """A trajectory with a main sequence and one more per entry of ``sequence_rewards`` (3 generated tokens each)."""
    from lit_agentrl.types import TokenSequence

    def tokens(seed: int) -> tuple[list[int], list[int], list[int], list[float]]:
        return [seed, seed + 1], [seed, seed + 1, 7, 8, 9], [0, 0, 1, 1, 1], [-0.5, -0.5, -0.5]

    prompt, ids, mask, logprobs = tokens(10 * group)
    others = [TokenSequence(*tokens(100 + i), reward=r) for i, r in enumerate(sequence_rewards)]
    return Trajectory(group, 0, "agent", prompt, ids, mask, logprobs, reward=reward, other_sequences=others)


def test_shared_rewards_give_every_sequence_its_trajectorys_advantage():
    # Group 0: rewards 1 and 0 -> mean 0.5, sample std 0.7071 -> advantages +-0.7071, whatever the sequence count.
    batch = [_trajectory(0, 1.0, None, None), _trajectory(0, 0.0)]
    prepared = prepare_samples(batch, "sample")
    assert [round(s.advantage, 4) for s in prepared.samples] == [0.7071, 0.7071, 0.7071, -0.7071]
    assert prepared.num_groups == 1 and batch[0].advantage == pytest.approx(0.7071, abs=1e-4)


def test_own_rewards_make_each_sequence_a_member_of_its_group():
    # Members: main 1.0, sub-agent 0.0 (its own), main 0.5 -> mean 0.5; population std sqrt(1/6) = 0.4082.
    batch = [_trajectory(0, 1.0, 0.0), _trajectory(0, 0.5)]
    advantages = [s.advantage for s in prepare_samples(batch, "population", sequence_rewards="own").samples]
    assert advantages == pytest.approx([0.5 / 0.408248, -0.5 / 0.408248, 0.0], abs=1e-4)
    with pytest.raises(ValueError, match="sequence_rewards: own"):
        prepare_samples(batch, "population")  # shared would drop the reward the agent gave: refused


@register_openai_agent("gateway_picks_second_choice")
async def picks_second(client: openai.AsyncOpenAI, row: dict, cfg) -> float:
    """Asks for two choices and goes on with the second, as a best-of-n agent would."""
    messages = list(row["messages"])
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL], n=2)
    assert [c.index for c in reply.choices] == [0, 1]
    chosen = reply.choices[1].message
    messages.append(chosen.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": chosen.tool_calls[0].id, "content": "5"})
    await client.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL])
    return 1.0


def test_n_choices_are_sequences_and_no_token_is_trained_twice(scripted_engine_factory, tokenizer):
    call = tool_call_text("add", {"a": 2, "b": 3})
    engine = Recording(scripted_engine_factory(["I guess 6.", call, "It is 5."]))
    (trajectory,) = rollout(engine, tokenizer, {**ROW, "agent_name": "gateway_picks_second_choice"}).trajectories
    assert not trajectory.failed, trajectory.failure_reason
    # The main sequence is the second choice, continued with the tool's answer; the first choice is another.
    assert generated(trajectory) == engine.outputs[1] + engine.outputs[2]
    (first_choice,) = trajectory.other_sequences
    assert generated(first_choice) == engine.outputs[0]
    assert trained_tokens(trajectory) == Counter(t for reply in engine.outputs for t in reply)
    assert trajectory.num_model_turns == 3 and trajectory.num_tool_calls == 1
    assert trajectory.extra_fields["template_drift"] == 0


@register_openai_agent("gateway_branches_late")
async def branches_late(client: openai.AsyncOpenAI, row: dict, cfg) -> float:
    """One turn, then two choices of the next one: the copy must not train the first turn again."""
    messages = list(row["messages"])
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again?"}]
    await client.chat.completions.create(model="policy", messages=messages, n=2)
    return 1.0


def test_choices_after_a_turn_train_the_turn_once(scripted_engine_factory, tokenizer):
    engine = Recording(scripted_engine_factory(["It is 5.", "Still 5.", "Maybe 4."]))
    (trajectory,) = rollout(engine, tokenizer, {**ROW, "agent_name": "gateway_branches_late"}).trajectories
    assert not trajectory.failed, trajectory.failure_reason
    (copy,) = trajectory.other_sequences
    assert generated(trajectory) == engine.outputs[0] + engine.outputs[1] and generated(copy) == engine.outputs[2]
    assert copy.all_token_ids[: len(engine.inputs[2])] == engine.inputs[2]  # the copy holds the whole context


@register_openai_agent("gateway_tool_choices")
async def tool_choices(client: openai.AsyncOpenAI, row: dict, cfg) -> float:
    """Asks with each kind of tool_choice; returns what the replies were, in its metrics."""
    messages = list(row["messages"])
    none = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL], tool_choice="none")
    forced = {"type": "function", "function": {"name": "add"}}
    named = await client.chat.completions.create(
        model="policy", messages=messages, tools=[ADD_TOOL], tool_choice=forced
    )
    required = await client.chat.completions.create(
        model="policy", messages=messages, tools=[ADD_TOOL], tool_choice="required"
    )
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        await client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=[ADD_TOOL],
            tool_choice={"type": "function", "function": {"name": "x"}},
        )
    replies = [none, named, required]
    return AgentResult(
        reward=1.0,
        final_answer=json.dumps([r.choices[0].message.model_dump(exclude_none=True) for r in replies]),
    )


def test_tool_choice_none_answers_in_text_and_unmet_forced_calls_are_counted(
    scripted_engine_factory, tokenizer, caplog
):
    call = tool_call_text("add", {"a": 2, "b": 3})
    engine = scripted_engine_factory([call, call, "No tool for me."])
    with caplog.at_level(logging.WARNING, logger="lit_agentrl.agents.gateway.server"):
        (trajectory,) = rollout(engine, tokenizer, {**ROW, "agent_name": "gateway_tool_choices"}).trajectories
    assert not trajectory.failed, trajectory.failure_reason
    none, named, required = json.loads(trajectory.str_output)
    assert "tool_calls" not in none and '"name": "add"' in none["content"]  # the markup, as text
    assert named["tool_calls"][0]["function"]["name"] == "add"
    assert "tool_calls" not in required and required["content"] == "No tool for me."
    # The call naming an unknown function was refused (and counted), leaving nothing behind.
    assert trajectory.extra_fields["metrics"] == {"tool_choice_unmet": 1.0, "refused_calls": 1.0}
    assert sum("tool_choice_unmet" in r.message for r in caplog.records) == 1


def test_drift_counts_positions_where_the_ids_differ_from_the_conversation_rendered_whole(tokenizer):
    from lit_agentrl.agents.drift import count_openai_drift

    messages = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False),
        add_special_tokens=False,
    )
    reply = [*tokenizer.encode("5", add_special_tokens=False), tokenizer.eos_token_id]
    kwargs = {"enable_thinking": False}
    assert count_openai_drift(messages, [1], [reply], prompt + reply, tokenizer, None, kwargs) == 0
    changed = [*prompt[:-1], prompt[-1] + 1, *reply]  # a prompt token the template would not have written
    assert count_openai_drift(messages, [1], [reply], changed, tokenizer, None, kwargs) == 1
