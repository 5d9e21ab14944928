"""One trajectory's calls through the gateway, kept token-exact: :class:`GatewaySession` and its samples.

Each call's messages are compared with what the trajectory's latest sample has rendered so far (its
conversation, ending with the model's last reply as the gateway returned it). When they continue it (the
same messages, then only tool or user messages), the new messages are encoded as the chat template renders
them after an assistant turn and appended to the sample's tokens, so the model's earlier tokens stay exactly as
sampled. Anything else (the agent rewrote or compacted its history, or a sub-agent started a fresh context)
starts a new sample of the same trajectory, rendered from the messages as sent.

A call changes the session only once it has succeeded (:meth:`GatewaySession.commit`): a refused or failed call
leaves nothing behind. Calls of one trajectory may overlap: a call that continues a sample another call is still
extending continues a branch of it instead (its earlier tokens masked, trained once in the original), so each
reply is attributed to exactly the context it was sampled from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lit_agentrl.context import TrajectoryContext
from lit_agentrl.types import TokenSequence

__all__ = ["GatewaySample", "GatewaySession", "PlannedCall", "flat_text", "normalized"]


@dataclass
class GatewaySample:
    """One token-exact sequence: the prompt, then generated turns and the tool/user turns between them."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_length: int
    tools: list[dict[str, Any]] | None
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The messages rendered so far, normalized, ending with the model's last reply."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The same as the agent sent them (with the replies as returned): the trajectory log's conversation."""
    finish_reason: dict[str, Any] | None = None
    num_model_turns: int = 0
    num_tool_calls: int = 0
    replies: list[int] = field(default_factory=list)
    """Indices in :attr:`messages` of the model's replies (those after the prompt), for the template drift check."""
    outputs: list[list[int]] = field(default_factory=list)
    """Each reply's generated ids, in order."""
    completion_ids: list[str] = field(default_factory=list)
    """Names of the replies whose tokens it holds: ``<response id>/<choice index>``, and the response id alone for
    a first choice (an agent gives a sample a reward of its own by one of them)."""
    reply_of: dict[str, int] = field(default_factory=dict)
    """Each name of :attr:`completion_ids` -> the index of its reply among :attr:`outputs` (its model turn)."""
    extending: bool = False
    """Whether a call in flight is extending it: an overlapping call that continues it takes a branch instead."""

    @classmethod
    def prompt(cls, ids: list[int], tools: list[dict[str, Any]] | None) -> GatewaySample:
        """A new sample of prompt ``ids`` (the call's messages, rendered; :meth:`GatewaySession.commit` records
        them as its conversation)."""
        return cls(ids, [0] * len(ids), [0.0] * len(ids), len(ids), tools)

    @property
    def output_ids(self) -> list[int]:
        """The last reply's generated ids (a continuation's suffix drops a repeated end-of-turn token)."""
        return self.outputs[-1] if self.outputs else []

    def add_reply(self, reply: dict[str, Any], meta: dict[str, Any], tool_calls: int) -> None:
        """Record the model's turn: the tokens ``ChatModel.generate_turn`` extended (``meta``, its response
        metadata), and ``reply`` (as the gateway answered it) in the conversation."""
        self.token_ids, self.loss_mask, self.logprobs = meta["token_ids"], meta["loss_mask"], meta["logprobs"]
        self.finish_reason = meta["finish_reason"]
        self.num_model_turns += 1
        self.num_tool_calls += tool_calls
        self.conversation.append(normalized(reply))
        self.replies.append(len(self.messages))
        self.outputs.append(list(meta["output_ids"]))
        self.messages.append(reply)

    @property
    def last_reply(self) -> str:
        """The text of the model's latest reply, as the gateway returned it ("" before any)."""
        return flat_text(self.messages[self.replies[-1]].get("content")) if self.replies else ""

    def sequence(self, reward: float | None = None) -> TokenSequence:
        """Its tokens as a trajectory's :class:`~lit_agentrl.types.TokenSequence` (copies)."""
        prompt = self.prompt_length
        ids = list(self.token_ids)
        return TokenSequence(ids[:prompt], ids, list(self.loss_mask), list(self.logprobs[prompt:]), reward)

    def branch(self) -> GatewaySample:
        """A copy to sample another choice from (``n > 1``): the tokens generated so far stay the original's to
        train (masked here), so no token is trained twice."""
        prompt = self.prompt_length
        return GatewaySample(
            token_ids=list(self.token_ids),
            loss_mask=[0] * len(self.token_ids),
            logprobs=[0.0] * len(self.token_ids),
            prompt_length=prompt,
            tools=self.tools,
            conversation=list(self.conversation),
            messages=list(self.messages),
            replies=list(self.replies),
            outputs=list(self.outputs),
        )


@dataclass
class PlannedCall:
    """Where one call samples from, decided before it generates and kept apart from the session until it succeeds."""

    starts: list[GatewaySample]
    """Each choice's sample: the one the call continues (choice 0, when no other call is extending it), else a branch
    of it, or a new sample; each ends with the call's new turns once committed."""
    new_messages: list[dict[str, Any]]
    """The messages the call adds to its samples' conversation (all of them for a new sample)."""
    suffix: list[int]
    """The new messages' ids after the samples' tokens (empty for a new sample, whose prompt holds them)."""
    continued: GatewaySample | None = None
    """The session's sample choice 0 extends in place (marked :attr:`GatewaySample.extending` until the call ends)."""


@dataclass
class GatewaySession:
    """A trajectory's samples, and the trajectory's context, entered by every call made for it."""

    id: str
    context: TrajectoryContext | None
    samples: list[GatewaySample] = field(default_factory=list)
    last: GatewaySample | None = None
    """The sample of the latest reply: the trajectory's main sequence."""
    forced_calls: int = 0
    """Calls whose ``tool_choice`` asked for a tool call (``required`` or a named function)."""
    unmet_tool_choices: int = 0
    """Of those, calls whose reply did not make the call asked for (the engine samples freely)."""
    refused_calls: int = 0
    """Calls answered with an error (a 4xx): they left nothing in the trajectory."""
    calls_in_flight: set[asyncio.Task[Any]] = field(default_factory=set)
    """The tasks serving its calls now: cancelled when the trajectory ends, so the engine aborts their requests."""

    def plan(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        choices: int,
        render: Callable[[], list[int]],
        encode: Callable[[GatewaySample, list[dict[str, Any]]], list[int]],
    ) -> PlannedCall:
        """Where a call of ``messages`` samples its ``choices`` from: the sample it continues (``encode`` gives the new
        turns' ids after it), or a new one of ``render``'s ids. Choice 0 extends a continued sample in place unless an
        overlapping call is extending it; every other start is a branch, whose earlier tokens are the original's to
        train. Marks what it continues as extended: :meth:`release` it when the call ends, succeeded or not."""
        found = self.continuation(messages, tools)
        if found is None:
            first, new, suffix, continued = GatewaySample.prompt(render(), tools), list(messages), [], None
        else:
            sample, new = found
            suffix = encode(sample, new)
            continued = None if sample.extending else sample
            first = sample if continued is not None else sample.branch()
        if continued is not None:
            continued.extending = True
        starts = [first] + [first.branch() for _ in range(choices - 1)]
        return PlannedCall(starts, new, suffix, continued)

    def commit(self, call: PlannedCall) -> None:
        """Record a succeeded call's new turns in its samples and make them the session's (the replies themselves
        are appended by the caller); the first choice's sample becomes the main sequence."""
        normalized_new = [normalized(m) for m in call.new_messages]
        for start in call.starts:
            start.conversation += normalized_new
            start.messages += call.new_messages
            if start is not call.continued:
                self.samples.append(start)
        self.last = call.starts[0]

    @staticmethod
    def release(call: PlannedCall) -> None:
        if call.continued is not None:
            call.continued.extending = False

    def cancel_calls(self) -> None:
        """Cancel the calls still in flight (the trajectory ended or timed out): their engine requests are aborted."""
        for task in list(self.calls_in_flight):
            task.cancel()

    def continuation(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[GatewaySample, list[dict[str, Any]]] | None:
        """The sample these messages continue (the latest first: a main agent resumes after a sub-agent's calls,
        an agent picks one of ``n`` choices) and the messages new to it, or None (a new sample)."""
        incoming = [normalized(m) for m in messages]
        wanted = normalized_tools(tools)
        for sample in ([self.last] if self.last is not None else []) + self.samples[::-1]:
            seen = len(sample.conversation)
            if (
                wanted != normalized_tools(sample.tools)
                or len(incoming) <= seen
                or incoming[:seen] != sample.conversation
            ):
                continue
            new = messages[seen:]
            if any(m.get("role") == "assistant" for m in new):  # a reply the model never gave: a rewritten history
                continue
            return sample, new
        return None


def normalized(message: dict[str, Any]) -> dict[str, Any]:
    """What decides how a message renders: role, text, tool calls (name and parsed arguments), tool call id, name."""
    found: dict[str, Any] = {"role": message.get("role"), "content": flat_text(message.get("content"))}
    calls = message.get("tool_calls") or []
    if calls:
        found["tool_calls"] = [_call(call) for call in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key):
            found[key] = message[key]
    return found


def flat_text(content: Any) -> str:
    """A message's content as text: text parts joined by a space, as SGLang flattens them for a chat template that
    takes strings (Qwen's do); None is empty."""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content or ""


def _call(call: dict[str, Any]) -> tuple[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # not JSON: compared as the text it is
            arguments = json.loads(arguments)
    return str(function.get("name")), json.dumps(arguments, sort_keys=True)


def normalized_tools(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)
