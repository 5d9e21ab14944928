"""Parse Hermes/Qwen tool calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) from model text.

The parser never raises: whatever the model wrote, a call it cannot read becomes an ``invalid_tool_call``
carrying the error, so the agent can answer the model with it instead of crashing the trajectory.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass, field

from langchain_core.messages.tool import InvalidToolCall, ToolCall, invalid_tool_call, tool_call

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)(?:" + re.escape(TOOL_CALL_END) + r"|\Z)", re.DOTALL)


@dataclass
class ParsedResponse:
    """A model turn split into its plain text and its tool calls."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)


def parse_tool_calls(text: str) -> ParsedResponse:
    """Split ``text`` into the content outside ``<tool_call>`` blocks and the calls inside them.

    An unterminated last block is still parsed (generation may stop at ``max_new_tokens``).
    """
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for match in _BLOCK.finditer(text):
        parsed = _parse_block(match.group(1))
        (calls if parsed.get("type") == "tool_call" else invalid).append(parsed)  # type: ignore[arg-type]
    content = _BLOCK.sub("", text).strip() if calls or invalid else text
    return ParsedResponse(content=content, tool_calls=calls, invalid_tool_calls=invalid)


def _parse_block(raw: str) -> ToolCall | InvalidToolCall:
    call_id = f"call_{uuid.uuid4().hex[:24]}"
    body = raw.strip()
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        return invalid_tool_call(name=None, args=body, id=call_id, error=f"invalid JSON in tool call: {exc}")
    if not isinstance(payload, dict):
        return invalid_tool_call(name=None, args=body, id=call_id, error="a tool call must be a JSON object")
    name = payload.get("name")
    args = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode the arguments
        with contextlib.suppress(json.JSONDecodeError, RecursionError):
            args = json.loads(args)
    if not isinstance(name, str) or not name:
        return invalid_tool_call(name=None, args=body, id=call_id, error='a tool call needs a string "name"')
    if not isinstance(args, dict):
        return invalid_tool_call(name=name, args=body, id=call_id, error='tool "arguments" must be a JSON object')
    return tool_call(name=name, args=args, id=call_id)
