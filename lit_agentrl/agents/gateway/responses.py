"""What the gateway answers: a turn as an OpenAI assistant message, the ``chat.completion`` of a call (streamed as
``chat.completion.chunk`` events when asked) and OpenAI-style error bodies, built with the ``openai`` package's types."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from lit_agentrl.agents.gateway.request import SERVED_MODEL, ChatRequest, GatewayError

__all__ = ["completion", "error_response", "reply_message", "stream_events"]


def reply_message(turn: Any, raw_text: str | None = None) -> dict[str, Any]:
    """The model's turn as an OpenAI assistant message (tool calls with ids and JSON arguments); with ``raw_text``
    (``tool_choice: none``) its text as generated, tool-call markup included, and no calls."""
    if raw_text is not None:
        return {"role": "assistant", "content": raw_text}
    reply: dict[str, Any] = {"role": "assistant", "content": turn.content or None}
    calls = [
        {
            "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
        }
        for call in turn.tool_calls
    ]
    if calls:
        reply["tool_calls"] = calls
    return reply


def _finish(meta: dict[str, Any], reply: dict[str, Any]) -> str:
    if (meta.get("finish_reason") or {}).get("type") == "length":
        return "length"
    return "tool_calls" if reply.get("tool_calls") else "stop"


def completion(
    completion_id: str, replies: list[dict[str, Any]], turns: list[Any], request: ChatRequest, tokenizer: Any
) -> Any:
    """The ``chat.completion`` of one call: a choice per reply (``n``), usage over them all."""
    from openai.types.chat import ChatCompletion

    choices, completion_tokens = [], 0
    for index, (reply, turn) in enumerate(zip(replies, turns)):
        meta = turn.response_metadata
        output_ids = meta["output_ids"]
        completion_tokens += len(output_ids)
        choice: dict[str, Any] = {"index": index, "message": reply, "finish_reason": _finish(meta, reply)}
        if request.logprobs:
            values = meta["logprobs"][-len(output_ids) :] if output_ids else []
            choice["logprobs"] = {
                "content": [
                    {"token": tokenizer.decode([token]), "logprob": value, "bytes": None, "top_logprobs": []}
                    for token, value in zip(output_ids, values)
                ]
            }
        choices.append(choice)
    first = turns[0].response_metadata
    prompt = len(first["token_ids"]) - len(first["output_ids"])
    return ChatCompletion.model_validate(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": SERVED_MODEL,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens,
            },
        }
    )


async def stream_events(answer: Any, request: ChatRequest) -> AsyncIterator[str]:
    """The finished completion as server-sent ``chat.completion.chunk`` events (each turn is generated whole), the
    sampled tokens' log-probs in the content chunk when asked."""
    from openai.types.chat import ChatCompletionChunk

    base = {
        "id": answer.id,
        "object": "chat.completion.chunk",
        "created": answer.created,
        "model": answer.model,
    }
    chunks = []
    for choice in answer.choices:
        message = choice.message
        delta: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            delta["tool_calls"] = [
                {
                    "index": i,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for i, call in enumerate(message.tool_calls)
            ]
        content: dict[str, Any] = {"index": choice.index, "delta": delta, "finish_reason": None}
        if choice.logprobs is not None:
            content["logprobs"] = choice.logprobs.model_dump()
        chunks.append({**base, "choices": [content]})
        chunks.append(
            {**base, "choices": [{"index": choice.index, "delta": {}, "finish_reason": choice.finish_reason}]}
        )
    if request.include_usage:
        chunks.append({**base, "choices": [], "usage": answer.usage.model_dump()})
    for chunk in chunks:
        yield f"data: {ChatCompletionChunk.model_validate(chunk).model_dump_json(exclude_none=True)}\n\n"
    yield "data: [DONE]\n\n"


def error_response(exc: GatewayError) -> Any:
    """``exc`` as OpenAI answers an error: its status, ``{"error": {"message", "type", "param", "code"}}``."""
    from starlette.responses import JSONResponse

    error = {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.code}
    return JSONResponse({"error": error}, status_code=exc.status)
