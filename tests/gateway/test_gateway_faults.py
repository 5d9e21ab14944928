"""The gateway under misuse and faults: every request error is a 4xx naming the field (the ``openai`` client's own
error types in process too), a refused call leaves nothing in its trajectory, overlapping calls are each trained from
the context they were sampled from, and a trajectory that ends cancels its calls in flight."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import openai
import pytest
from gateway_support import ROW, SAMPLING, Recording, rollout

from lit_agentrl.agents import AgentResult, register_openai_agent
from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.agents.gateway import Gateway
from lit_agentrl.context import TrajectoryContext
from lit_agentrl.engines.base import EngineWrapper
from lit_agentrl.rewards.registry import register_reward

BAD_BODIES = [
    (b"{not json", "not valid JSON", None),
    (b"", "body is empty", None),
    (b"[1, 2]", "must be a JSON object", None),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "lots"}), "max_tokens", "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}), "positive integer", "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": 7}]}), "content must be a string", "messages[0]"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}), "not supported", "top_logprobs"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "stop": [1]}), "stop must be", "stop"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [{"x": 1}]}), "tools[0]", "tools"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}), "a number", "temperature"),
]


async def _serving(engine, tokenizer):
    gateway = Gateway(ChatModel(model="policy", llm=engine, tokenizer=tokenizer))
    await gateway.start()
    return gateway, gateway.open_session(TrajectoryContext(sampling_params=SAMPLING))


@pytest.mark.parametrize(("body", "says", "param"), BAD_BODIES)
def test_every_bad_request_is_a_400_naming_the_field_over_http_and_in_process(
    scripted_engine_factory, tokenizer, body, says, param
):
    async def main():
        gateway, session = await _serving(scripted_engine_factory([]), tokenizer)
        url = f"{gateway.base_url(session)}/chat/completions"
        try:
            async with httpx.AsyncClient() as http:
                over_http = await http.post(url, content=body, headers={"content-type": "application/json"})
            in_process = await gateway.http_client.post(url, content=body)
        finally:
            await gateway.stop()
        return over_http, in_process, session

    over_http, in_process, session = asyncio.run(main())
    for response in (over_http, in_process):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert says in error["message"] and error["type"] == "invalid_request_error" and error["param"] == param
    assert session.samples == [] and session.last is None and session.refused_calls == 2


def test_the_in_process_client_raises_the_openai_packages_errors_not_the_servers(scripted_engine_factory, tokenizer):
    async def main():
        gateway, session = await _serving(scripted_engine_factory([]), tokenizer)
        client = openai.AsyncOpenAI(
            base_url=gateway.base_url(session), api_key=session.id, max_retries=0, http_client=gateway.http_client
        )
        try:
            with pytest.raises(openai.BadRequestError, match="max_tokens must be a positive integer"):
                await client.chat.completions.create(model="policy", messages=ROW["prompt"], max_tokens=-1)
        finally:
            await gateway.stop()

    asyncio.run(main())


class FailingOnce(EngineWrapper):
    """Fails its first request as a broken engine would, then serves."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.failed = False

    async def async_generate(self, **kwargs):
        if not self.failed:
            self.failed = True
            raise RuntimeError("the engine lost its GPU")
        return await self.inner.async_generate(**kwargs)


@register_openai_agent("gateway_recovering")
async def recovering(client: openai.AsyncOpenAI, row: dict, cfg) -> None:
    """A bad call (refused), then a good one: the agent catches the error and goes on."""
    with contextlib.suppress(openai.BadRequestError):
        await client.chat.completions.create(model="gpt-4o", messages=row["messages"], max_tokens=0)
    await client.chat.completions.create(model="gpt-4o", messages=row["messages"])
    return None


SCORED: list[str] = []


@register_reward("gateway_scores_last_reply")
def _record_scored(text: str, truth: object, **_: object) -> float:
    SCORED.append(text)
    return float(str(truth) in text)


def test_a_refused_call_leaves_nothing_and_the_agent_goes_on(scripted_engine_factory, tokenizer):
    engine = Recording(scripted_engine_factory(["It is 5."]))
    row = {**ROW, "agent_name": "gateway_recovering", "data_source": "gateway_scores_last_reply"}
    SCORED.clear()
    (trajectory,) = rollout(engine, tokenizer, row).trajectories
    assert not trajectory.failed, trajectory.failure_reason
    assert trajectory.other_sequences == [] and trajectory.extra_fields["template_drift"] == 0
    assert [t for t, m in zip(trajectory.all_token_ids, trajectory.loss_mask) if m] == engine.outputs[0]
    assert trajectory.extra_fields["metrics"]["refused_calls"] == 1.0
    # The reward function scored the last reply's text (no end-of-turn markup), whatever model name the agent used.
    assert SCORED == ["It is 5."] and trajectory.reward == 1.0


def test_an_engine_failure_fails_the_trajectory_even_when_the_agent_catches_it(scripted_engine_factory, tokenizer):
    engine = FailingOnce(scripted_engine_factory(["It is 5.", "It is 5."]))

    @register_openai_agent("gateway_swallowing")
    async def swallowing(client: openai.AsyncOpenAI, row: dict, cfg) -> float:
        with contextlib.suppress(openai.InternalServerError):
            await client.chat.completions.create(model="policy", messages=row["messages"])
        await client.chat.completions.create(model="policy", messages=row["messages"])
        return 1.0

    (trajectory,) = rollout(engine, tokenizer, {**ROW, "agent_name": "gateway_swallowing"}).trajectories
    assert trajectory.failed and "the engine failed a call (RuntimeError: the engine lost its GPU)" in (
        trajectory.failure_reason
    )


class HoldingSecond(EngineWrapper):
    """Holds its second request until a third has arrived, so two calls of one trajectory overlap."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.requests, self.third_arrived = 0, asyncio.Event()

    async def async_generate(self, **kwargs):
        self.requests += 1
        if self.requests == 2:
            await asyncio.wait_for(self.third_arrived.wait(), 60)
        elif self.requests == 3:
            self.third_arrived.set()
        return await self.inner.async_generate(**kwargs)


@register_openai_agent("gateway_overlapping")
async def overlapping(client: openai.AsyncOpenAI, row: dict, cfg) -> AgentResult:
    """Guess, then send two continuations at once: q extends the history p sent, while p is unanswered."""
    history = list(row["messages"])
    first = await client.chat.completions.create(model="policy", messages=history)
    history.append(first.choices[0].message.model_dump(exclude_none=True))
    p = [*history, {"role": "user", "content": "higher"}]
    q = [*p, {"role": "user", "content": "lower"}]
    await asyncio.gather(*(client.chat.completions.create(model="policy", messages=m) for m in (p, q)))
    return AgentResult(reward=1.0)


def test_overlapping_calls_each_train_on_the_context_they_were_sampled_from(scripted_engine_factory, tokenizer):
    engine = Recording(HoldingSecond(scripted_engine_factory(["3", "4", "5"])))
    (trajectory,) = rollout(engine, tokenizer, {**ROW, "agent_name": "gateway_overlapping"}).trajectories
    assert not trajectory.failed, trajectory.failure_reason
    sequences = [trajectory.main_sequence, *trajectory.other_sequences]
    # Every sampled reply is trained exactly once, in the sequence whose tokens are what the engine was given.
    trained = sorted(tuple(t for t, m in zip(s.all_token_ids, s.loss_mask) if m) for s in sequences)
    by_request = {tuple(request): output for request, output in zip(engine.inputs, engine.outputs)}
    assert sum(len(s) for s in trained) == sum(len(o) for o in engine.outputs)
    for sequence in sequences:
        assert any(sequence.all_token_ids[: len(request)] == list(request) for request in by_request)
    # The engine saw q as the client sent it (both user turns), and every sequence renders as its conversation.
    second, third = engine.inputs[1:]
    assert {tokenizer.decode(second).count("lower"), tokenizer.decode(third).count("lower")} == {0, 1}
    assert all("higher" in tokenizer.decode(request) for request in (second, third))
    assert trajectory.extra_fields["template_drift"] == 0


class Hanging(EngineWrapper):
    """Never answers: records that its request was cancelled (as the engines abort a cancelled request)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.started, self.cancelled = asyncio.Event(), 0

    async def async_generate(self, **kwargs):
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def test_closing_a_session_cancels_its_calls_in_flight_over_http(scripted_engine_factory, tokenizer):
    engine = Hanging(scripted_engine_factory([]))

    async def main():
        gateway, session = await _serving(engine, tokenizer)
        client = openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key=session.id, max_retries=0)
        try:
            call = asyncio.create_task(client.chat.completions.create(model="policy", messages=ROW["prompt"]))
            await engine.started.wait()
            gateway.close_session(session)  # the trajectory ended (its agent timed out, its program was killed)
            with pytest.raises(openai.APIStatusError, match="trajectory ended while this call was in flight"):
                await call
        finally:
            await client.close()
            await gateway.stop()
        return session

    session = asyncio.run(main())
    assert engine.cancelled == 1 and not session.calls_in_flight and session.samples == []


@pytest.mark.parametrize("n", [1, 2])
def test_a_prompt_past_the_engines_context_is_a_400_that_never_reaches_it(engine, tokenizer, n):
    """The real transformers engine refuses it at its front door (its context: the model's max positions), for one
    choice or several (sampled at once: the first failure is the call's, not an engine fault)."""
    seen = Recording(engine)

    async def main():
        gateway, session = await _serving(seen, tokenizer)
        client = openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key=session.id, max_retries=0)
        flood = [{"role": "user", "content": "7 " * (engine.context_length + 10)}]
        try:
            with pytest.raises(openai.BadRequestError, match="context length") as refused:
                await client.chat.completions.create(model="policy", messages=flood, n=n)
        finally:
            await client.close()
            await gateway.stop()
        return refused.value, session

    error, session = asyncio.run(main())
    assert error.code == "context_length_exceeded" and error.param == "messages"
    assert seen.outputs == [None] * n and session.samples == [] and session.refused_calls == 1
    assert session.context.faults == []  # the agent's fault, not the engine's: the trajectory goes on


def test_messages_the_chat_template_refuses_are_a_400(scripted_engine_factory, tokenizer):
    """Qwen's templates raise on some conversations (no user turn, say): the agent's fault, answered as a 400."""
    import copy

    strict = copy.deepcopy(tokenizer)
    strict.chat_template = (
        "{% if messages | selectattr('role', 'equalto', 'user') | list | length == 0 %}"
        "{{ raise_exception('No user query found in messages.') }}{% endif %}" + tokenizer.chat_template
    )

    async def main():
        gateway, session = await _serving(scripted_engine_factory([]), strict)
        client = openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key=session.id, max_retries=0)
        try:
            with pytest.raises(openai.BadRequestError, match="No user query found in messages"):
                await client.chat.completions.create(model="policy", messages=[{"role": "system", "content": "x"}])
        finally:
            await client.close()
            await gateway.stop()
        return session

    session = asyncio.run(main())
    assert session.context.faults == [] and session.refused_calls == 1
