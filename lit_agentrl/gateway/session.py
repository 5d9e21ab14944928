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

__all__ = ["GatewaySample", "GatewaySession", "normalized"]


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
    output_ids: list[int] = field(default_factory=list)
    """The last turn's generated ids (a continuation's suffix drops a repeated end-of-turn token)."""
    finish_reason: dict[str, Any] | None = None
    num_model_turns: int = 0
    num_tool_calls: int = 0
    raw_texts: list[str] = field(default_factory=list)


@dataclass
class GatewaySession:
    """A trajectory's samples, and the trajectory's context, entered by every call made for it."""

    id: str
    context: TrajectoryContext | None
    samples: list[GatewaySample] = field(default_factory=list)
    calls: int = 0

    def continuation(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[GatewaySample, list[dict[str, Any]]] | None:
        """The sample these messages continue and the messages new to it, or None (a new sample)."""
        if not self.samples:
            return None
        sample = self.samples[-1]
        seen = len(sample.conversation)
        incoming = [normalized(m) for m in messages]
        if normalized_tools(tools) != normalized_tools(sample.tools) or len(incoming) <= seen:
            return None
        if incoming[:seen] != sample.conversation:
            return None
        new = messages[seen:]
        if any(m.get("role") == "assistant" for m in new):  # a reply the model never gave: a rewritten history
            return None
        return sample, new


def normalized(message: dict[str, Any]) -> dict[str, Any]:
    """What decides how a message renders: role, text, tool calls (name and parsed arguments), tool call id, name."""
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, in order
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    found: dict[str, Any] = {"role": message.get("role"), "content": content or ""}
    calls = message.get("tool_calls") or []
    if calls:
        found["tool_calls"] = [_call(call) for call in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key):
            found[key] = message[key]
    return found


def _call(call: dict[str, Any]) -> tuple[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # not JSON: compared as the text it is
            arguments = json.loads(arguments)
    return str(function.get("name")), json.dumps(arguments, sort_keys=True)


def normalized_tools(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)
