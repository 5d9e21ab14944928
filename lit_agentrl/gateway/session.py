"""One trajectory's calls through the gateway, kept token-exact: :class:`GatewaySession` and its samples.

Each call's messages are compared with what the trajectory's latest sample has rendered so far (its
conversation, ending with the model's last reply as the gateway returned it). When they continue it (the
same messages, then only tool or user messages), the new messages are encoded as the chat template renders
them after an assistant turn and appended to the sample's tokens, so the model's earlier tokens stay exactly as
sampled. Anything else (the agent rewrote or compacted its history, or a sub-agent started a fresh context)
starts a new sample of the same trajectory, rendered from the messages as sent.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from lit_agentrl.context import TrajectoryContext
from lit_agentrl.types import TokenSequence

__all__ = ["GatewaySample", "GatewaySession", "flat_text", "normalized"]


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

    @property
    def output_ids(self) -> list[int]:
        """The last reply's generated ids (a continuation's suffix drops a repeated end-of-turn token)."""
        return self.outputs[-1] if self.outputs else []

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
