"""A ``chat.completions`` request body, checked field by field before anything is sampled: :func:`parse_request`.

Every fault the gateway can see in a request is a :class:`GatewayError` with an HTTP status of 4xx and the field it
names (``param``), answered as OpenAI answers it (``{"error": {"message", "type", "param", "code"}}``), so an agent's
client raises the ``openai`` package's own error types (``BadRequestError``, ...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lit_agentrl.agents.gateway.session import flat_text

__all__ = ["MAX_CHOICES", "SERVED_MODEL", "ChatRequest", "GatewayError", "parse_body", "parse_request"]

MAX_CHOICES = 64
"""The most choices (``n``) one call may ask for."""
SERVED_MODEL = "policy"
"""The one model the gateway serves, as ``/v1/models`` lists it and responses name it. A request's ``model`` may
name any model (agents written for another model run unchanged): it is always the policy that answers."""
TEXT_PARTS = ("text", "input_text")
"""The content parts the gateway renders."""
ROLES = ("system", "developer", "user", "assistant", "tool")


class GatewayError(Exception):
    """A request the gateway refuses or could not serve: answered as an OpenAI-style error with this status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    @property
    def kind(self) -> str:
        """OpenAI's error ``type`` for the status."""
        return {401: "authentication_error", 404: "not_found_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "api_error"
        )


@dataclass(frozen=True)
class ChatRequest:
    """The fields of a ``chat.completions`` body the gateway uses, checked."""

    messages: list[dict[str, Any]]
    """As rendered: text parts joined into a string, ``developer`` as ``system``."""
    tools: list[dict[str, Any]] | None
    choices: int
    tool_choice: Any
    max_tokens: int | None
    stop: list[str] | None
    logprobs: bool
    stream: bool
    include_usage: bool
    asked_sampling: dict[str, float]
    """``temperature`` and ``top_p`` as asked (the run's own are used: see the server's docstring)."""


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what it is instead."""
    if not raw.strip():
        raise GatewayError(400, "the request body is empty: send a JSON object with `messages`")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise GatewayError(400, f"the request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise GatewayError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_request(body: dict[str, Any]) -> ChatRequest:
    """``body`` checked field by field (a :class:`GatewayError` 400 naming the first bad one)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise GatewayError(400, f"model must be a string, got {model!r}", "model")
    tools = _tools(body.get("tools"))
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise GatewayError(400, "stream_options must be an object", "stream_options")
    return ChatRequest(
        messages=_messages(body.get("messages")),
        tools=tools,
        choices=_choices(body.get("n")),
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        max_tokens=_max_tokens(body),
        stop=_stop(body.get("stop")),
        logprobs=_logprobs(body),
        stream=_flag(body, "stream"),
        include_usage=bool(stream_options.get("include_usage")),
        asked_sampling={key: _number(body, key) for key in ("temperature", "top_p") if body.get(key) is not None},
    )


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise GatewayError(400, f"{key} must be true or false, got {value!r}", key)
    return bool(value)


def _number(body: dict[str, Any], key: str) -> float:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GatewayError(400, f"{key} must be a number, got {value!r}", key)
    return float(value)


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GatewayError(400, f"{key} must be a positive integer, got {value!r}", key)
    return value


def _choices(n: Any) -> int:
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise GatewayError(400, f"n must be an integer from 1 to {MAX_CHOICES}, got {n!r}", "n")
    return n


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        if body.get(key) is not None:
            return _positive_int(body[key], key)
    return None


def _stop(stop: Any) -> list[str] | None:
    if stop is None or stop == []:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise GatewayError(400, f"stop must be a non-empty string or a list of them, got {stop!r}", "stop")
    return stops


def _logprobs(body: dict[str, Any]) -> bool:
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise GatewayError(400, f"top_logprobs must be an integer >= 0, got {top!r}", "top_logprobs")
    if top:  # never answered empty in silence
        raise GatewayError(
            400,
            "top_logprobs is not supported: the gateway returns each sampled token's own log-prob (logprobs: true), "
            "which is what the trainer uses",
            "top_logprobs",
        )
    return _flag(body, "logprobs")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    if not isinstance(tools, list):
        raise GatewayError(400, f"tools must be a list of function tools, got {type(tools).__name__}", "tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise GatewayError(400, f"tools[{index}] must be {{'type': 'function', 'function': {{...}}}}", "tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise GatewayError(400, f"tools[{index}].function.name must be a non-empty string", "tools")
    return tools


def _tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> Any:
    """``auto``, ``none``, ``required`` or a named function of ``tools``."""
    if choice is None or choice in ("auto", "none"):
        return choice
    names = [tool["function"]["name"] for tool in tools or []]
    if choice == "required":
        if not names:
            raise GatewayError(400, "tool_choice 'required' needs tools", "tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name not in names:
            raise GatewayError(
                400, f"tool_choice names the function {name!r}, which is not among the tools {names}", "tool_choice"
            )
        return choice
    raise GatewayError(
        400, f"tool_choice must be 'auto', 'none', 'required' or a named function, got {choice!r}", "tool_choice"
    )


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise GatewayError(400, "messages must be a non-empty list of message objects", "messages")
    for index, message in enumerate(messages):
        _check_message(index, message)
    # Text parts become one string (chat templates such as Qwen's take strings); "developer" is "system".
    return [
        dict(m, role="system" if m["role"] == "developer" else m["role"], content=flat_text(m.get("content")))
        if isinstance(m.get("content"), list) or m["role"] == "developer"
        else m
        for m in messages
    ]


def _check_message(index: int, message: dict[str, Any]) -> None:
    where = f"messages[{index}]"
    if message.get("role") not in ROLES:
        raise GatewayError(400, f"{where}.role must be system, developer, user, assistant or tool", where)
    content = message.get("content")
    if isinstance(content, list):
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in TEXT_PARTS:  # never dropped in silence: the model would train on a prompt it never saw
                raise GatewayError(
                    400,
                    f"{where}.content[{k}] is a {kind!r} part: the gateway renders text parts only (a vision-language "
                    "agent is written as an AgentGraph, whose ChatModel renders images)",
                    where,
                )
            if not isinstance(part.get("text"), str):
                raise GatewayError(400, f"{where}.content[{k}].text must be a string", where)
    elif content is not None and not isinstance(content, str):
        raise GatewayError(
            400, f"{where}.content must be a string, a list of text parts or null, got {type(content).__name__}", where
        )
    calls = message.get("tool_calls")
    if calls is not None and (
        not isinstance(calls, list)
        or not all(isinstance(c, dict) and isinstance((c.get("function") or {}).get("name"), str) for c in calls)
    ):
        raise GatewayError(400, f"{where}.tool_calls must be a list of calls with a function name", where)
