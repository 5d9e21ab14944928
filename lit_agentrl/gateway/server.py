"""The OpenAI-compatible gateway: ``/v1/chat/completions`` and ``/v1/models`` over one rollout engine.

A :class:`Gateway` serves on loopback (uvicorn, a Starlette app) from the rollout's own event loop. The rollout
manager opens a :class:`~lit_agentrl.gateway.session.GatewaySession` per trajectory and hands the agent a base
URL holding its id (``http://127.0.0.1:PORT/t/<id>/v1``; the id also works as the API key at ``/v1``), so
every call is attributed to its trajectory: the handler enters the trajectory's context (its admission tag and
sampling parameters), encodes the messages token-exactly (:mod:`.session`), generates through the engine, parses
tool calls with the tool loop's parser, records the sampled ids and log-probs, and answers with the ``openai``
package's own response types (streamed as server-sent events when asked).

Sampling follows the run's parameters, whatever the request says: the trainer computes log-probs at the run's
temperature, so a request's ``temperature`` or ``top_p`` that differ are not used (a warning names them once);
``max_tokens``/``max_completion_tokens`` may only lower the run's per-turn limit, and ``stop`` strings are
honoured. ``n`` choices are sampled from the same context, each other than the first into a sample of its own;
``tool_choice`` ``none`` answers in text, and a forced call the reply did not make is counted, never imposed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.context import TrajectoryContext, enter_trajectory
from lit_agentrl.gateway.session import GatewaySample, GatewaySession, flat_text, normalized

__all__ = ["Gateway", "GatewayError"]

log = logging.getLogger(__name__)

MAX_CHOICES = 64
"""The most choices (``n``) one call may ask for."""
TEXT_PARTS = ("text", "input_text")
"""The content parts the gateway renders."""
IGNORED_SAMPLING = ("temperature", "top_p")
"""Request fields the run's own values override (the trainer's log-probs assume the run's)."""


class GatewayError(Exception):
    """A request the gateway refuses: answered as an OpenAI-style error with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Gateway:
    """An OpenAI-compatible HTTP API over ``chat_model``'s engine, for the trajectories of one rollout loop."""

    def __init__(self, chat_model: ChatModel, host: str = "127.0.0.1", port: int = 0) -> None:
        self.chat_model = chat_model
        self.host, self.port = host, port
        self.sessions: dict[str, GatewaySession] = {}
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._warned: set[str] = set()
        self._http_client: Any = None
        self._app = self.app()

    @property
    def http_client(self) -> Any:
        """The HTTP client of the agent functions this process runs (``openai.AsyncOpenAI(http_client=...)``): it
        hands each request to the same ASGI app in process, with no socket or HTTP parsing, since the agent and the
        gateway share the rollout's event loop (clients of their own, a LangChain model or a separate program, go
        through uvicorn on loopback). One for all, made on first use: a client per trajectory would also pay for
        an SSL context each time."""
        if self._http_client is None:
            import importlib

            import openai

            # The httpx the installed openai builds on (httpx, or httpx2 in recent releases), for its ASGITransport.
            base = next(c for c in openai.DefaultAsyncHttpxClient.__mro__ if c.__name__ == "AsyncClient")
            library = importlib.import_module(base.__module__.split(".")[0])
            transport = library.ASGITransport(app=self._app)
            self._http_client = openai.DefaultAsyncHttpxClient(transport=transport, timeout=None)
        return self._http_client

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Serve from the running event loop; returns once the socket accepts connections."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # the trainer's signals stay the trainer's
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._http_client is not None:
            with contextlib.suppress(Exception):
                await self._http_client.aclose()
            self._http_client = None
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=10)
        self._server = self._task = None

    # ------------------------------------------------------------------------------------------ sessions

    def open_session(self, context: TrajectoryContext | None) -> GatewaySession:
        session = GatewaySession(id=f"traj-{uuid.uuid4().hex}", context=context)
        self.sessions[session.id] = session
        return session

    def close_session(self, session: GatewaySession) -> None:
        self.sessions.pop(session.id, None)

    def base_url(self, session: GatewaySession) -> str:
        return f"http://{self.host}:{self.port}/t/{session.id}/v1"

    # ------------------------------------------------------------------------------------------ the app

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        routes = [
            Route("/t/{session}/v1/chat/completions", self._completions, methods=["POST"]),
            Route("/t/{session}/v1/models", self._models, methods=["GET"]),
            Route("/v1/chat/completions", self._completions, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]
        return Starlette(routes=routes)

    def _session(self, request: Any) -> GatewaySession:
        key = request.path_params.get("session")
        if key is None:
            auth = request.headers.get("authorization", "")
            key = auth.removeprefix("Bearer ").strip() or None
        session = self.sessions.get(key or "")
        if session is None:
            raise GatewayError(401, "unknown or finished trajectory: use the base URL or API key the rollout gave")
        return session

    async def _models(self, request: Any) -> Any:
        from openai.types import Model
        from starlette.responses import JSONResponse

        try:
            self._session(request)
        except GatewayError as exc:
            return _error(exc)
        model = Model(id=self.chat_model.model_name, created=0, object="model", owned_by="lit-agentrl")
        return JSONResponse({"object": "list", "data": [model.model_dump()]})

    async def _completions(self, request: Any) -> Any:
        from starlette.responses import Response, StreamingResponse

        try:
            session = self._session(request)
            body = await request.json()
            if not isinstance(body, dict):
                raise GatewayError(400, "the request body must be a JSON object")
            completion = await self.complete(session, body)
        except GatewayError as exc:
            return _error(exc)
        if body.get("stream"):
            return StreamingResponse(_stream(completion, body), media_type="text/event-stream")
        return Response(completion.model_dump_json(exclude_none=True), media_type="application/json")

    # ------------------------------------------------------------------------------------------ one call

    async def complete(self, session: GatewaySession, body: dict[str, Any]) -> Any:
        """One ``chat.completions`` call of ``session``'s trajectory: generated, recorded, answered."""
        messages, tools = _messages(body), body.get("tools") or None
        choices, tool_choice = _choices(body), _tool_choice(body, tools)
        if session.context is not None:
            enter_trajectory(session.context)  # this request's task: the trajectory's tag and sampling params
        params = self._sampling(session, body)
        sample, suffix = self._sample_for(session, messages, tools)
        # Choice 0 continues the sample; the others continue copies of it, which become samples of their own.
        branches = [sample] + [sample.branch() for _ in range(choices - 1)]
        session.samples += branches[1:]
        if choices == 1:  # no task to create for the usual call
            turns = [await self._turn(sample, suffix, tools, params)]
        else:
            turns = list(await asyncio.gather(*(self._turn(branch, suffix, tools, params) for branch in branches)))
        session.last = sample
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        replies = []
        for index, (branch, turn) in enumerate(zip(branches, turns)):
            replies.append(self._record(session, branch, turn, tool_choice))
            # An agent names a choice by "<id>/<index>", or the first by the response's id alone.
            branch.completion_ids += (
                [completion_id, f"{completion_id}/0"] if index == 0 else [f"{completion_id}/{index}"]
            )
        return _completion(completion_id, self.chat_model.model_name, replies, turns, body, self.chat_model.tokenizer)

    def _sample_for(
        self, session: GatewaySession, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[GatewaySample, list[int]]:
        """The sample the call continues, with its new turns encoded as a suffix, or a new one rendered as sent."""
        found = session.continuation(messages, tools)
        if found is None:
            ids = self.chat_model.render_ids(messages, tools, add_generation_prompt=True)
            sample = GatewaySample(ids, [0] * len(ids), [0.0] * len(ids), len(ids), tools)
            sample.conversation = [normalized(m) for m in messages]
            sample.messages = list(messages)
            session.samples.append(sample)
            return sample, []
        sample, new = found
        suffix = self.chat_model.encode_suffix(new, tools, sample.output_ids)
        sample.conversation += [normalized(m) for m in new]
        sample.messages += new
        return sample, suffix

    async def _turn(
        self, sample: GatewaySample, suffix: list[int], tools: list[dict[str, Any]] | None, params: dict[str, Any]
    ) -> Any:
        """The model's next turn after ``sample``'s tokens and ``suffix`` (the call's new turns, encoded)."""
        return await self.chat_model.generate_turn(
            sample.token_ids + suffix,
            sample.loss_mask + [0] * len(suffix),
            sample.logprobs + [0.0] * len(suffix),
            sample.prompt_length,
            tools,
            params,
        )

    def _sampling(self, session: GatewaySession, body: dict[str, Any]) -> dict[str, Any]:
        run = session.context.sampling_params if session.context is not None else None
        if run is None:
            raise GatewayError(500, "the trajectory has no sampling parameters (not started by a rollout)")
        params = dict(run)
        for key in IGNORED_SAMPLING:
            if body.get(key) is not None and body[key] != params.get(key, 1.0) and key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "gateway: the agent asked for %s=%s; the run's %s=%s is used (the trainer's log-probs assume "
                    "it). Said once.",
                    key,
                    body[key],
                    key,
                    params.get(key, 1.0),
                )
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if limit is not None:
            params["max_new_tokens"] = min(int(limit), int(params.get("max_new_tokens", limit)))
        stop = body.get("stop")
        if stop:
            params["stop"] = [stop] if isinstance(stop, str) else list(stop)
        return params

    def _record(self, session: GatewaySession, sample: GatewaySample, turn: Any, tool_choice: Any) -> dict[str, Any]:
        """Keep the turn's tokens in ``sample``; the reply as an OpenAI assistant message."""
        meta = turn.response_metadata
        sample.token_ids, sample.loss_mask, sample.logprobs = meta["token_ids"], meta["loss_mask"], meta["logprobs"]
        sample.finish_reason = meta["finish_reason"]
        sample.num_model_turns += 1
        sample.num_tool_calls += len(turn.tool_calls) + len(turn.invalid_tool_calls)
        reply = _reply(turn, meta["raw_text"] if tool_choice == "none" else None)
        if tool_choice not in (None, "auto", "none"):
            self._check_tool_choice(session, reply, tool_choice)
        sample.conversation.append(normalized(reply))
        sample.replies.append(len(sample.messages))
        sample.outputs.append(list(meta["output_ids"]))
        sample.messages.append(reply)
        return reply

    def _check_tool_choice(self, session: GatewaySession, reply: dict[str, Any], tool_choice: Any) -> None:
        """Count a reply that did not make the tool call ``tool_choice`` asked for (warned about once): the
        engine samples freely, as the trainer's log-probs assume, so a forced call cannot be imposed."""
        called = [call["function"]["name"] for call in reply.get("tool_calls") or []]
        wanted = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None
        session.forced_calls += 1
        if called and (wanted is None or wanted in called):
            return
        session.unmet_tool_choices += 1
        if "tool_choice" not in self._warned:
            self._warned.add("tool_choice")
            log.warning(
                "gateway: a reply did not make the tool call tool_choice=%s asked for; the model samples freely (the "
                "trainer's log-probs assume it), so such replies are answered as they are and counted in the agent "
                "metric tool_choice_unmet. Said once.",
                json.dumps(tool_choice),
            )


def _choices(body: dict[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
        raise GatewayError(400, f"n must be an integer from 1 to {MAX_CHOICES}, got {n!r}")
    return n


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> Any:
    """The request's ``tool_choice``, checked: ``auto``, ``none``, ``required`` or a named function of ``tools``."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none"):
        return choice
    names = [(tool.get("function") or {}).get("name") for tool in tools or []]
    if choice == "required":
        if not names:
            raise GatewayError(400, "tool_choice 'required' needs tools")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name not in names:
            raise GatewayError(400, f"tool_choice names the function {name!r}, which is not among the tools {names}")
        return choice
    raise GatewayError(400, f"tool_choice must be 'auto', 'none', 'required' or a named function, got {choice!r}")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise GatewayError(400, "messages must be a non-empty list of message objects")
    for index, message in enumerate(messages):
        if message.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise GatewayError(400, f"messages[{index}].role must be system, user, assistant or tool")
        parts = message.get("content") if isinstance(message.get("content"), list) else []
        for k, part in enumerate(parts):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in TEXT_PARTS:  # never dropped in silence: the model would train on a prompt it never saw
                raise GatewayError(
                    400,
                    f"messages[{index}].content[{k}] is a {kind!r} part: the gateway renders text parts only (a "
                    "vision-language agent is written as an AgentGraph, whose ChatModel renders images)",
                )
    # Text parts become one string (chat templates such as Qwen's take strings); "developer" is "system".
    return [
        dict(m, role="system" if m["role"] == "developer" else m["role"], content=flat_text(m.get("content")))
        if isinstance(m.get("content"), list) or m["role"] == "developer"
        else m
        for m in messages
    ]


def _reply(turn: Any, raw_text: str | None = None) -> dict[str, Any]:
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


def _completion(
    completion_id: str,
    model: str,
    replies: list[dict[str, Any]],
    turns: list[Any],
    body: dict[str, Any],
    tokenizer: Any,
) -> Any:
    """The ``chat.completion`` of one call: a choice per reply (``n``), usage over them all."""
    from openai.types.chat import ChatCompletion

    choices, completion_tokens = [], 0
    for index, (reply, turn) in enumerate(zip(replies, turns)):
        meta = turn.response_metadata
        output_ids = meta["output_ids"]
        completion_tokens += len(output_ids)
        choice: dict[str, Any] = {"index": index, "message": reply, "finish_reason": _finish(meta, reply)}
        if body.get("logprobs"):
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
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens,
            },
        }
    )


async def _stream(completion: Any, body: dict[str, Any]) -> AsyncIterator[str]:
    """The finished completion as server-sent ``chat.completion.chunk`` events (each turn is generated whole)."""
    from openai.types.chat import ChatCompletionChunk

    base = {
        "id": completion.id,
        "object": "chat.completion.chunk",
        "created": completion.created,
        "model": completion.model,
    }
    chunks = []
    for choice in completion.choices:
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
        chunks.append({**base, "choices": [{"index": choice.index, "delta": delta, "finish_reason": None}]})
        chunks.append(
            {**base, "choices": [{"index": choice.index, "delta": {}, "finish_reason": choice.finish_reason}]}
        )
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**base, "choices": [], "usage": completion.usage.model_dump()})
    for chunk in chunks:
        yield f"data: {ChatCompletionChunk.model_validate(chunk).model_dump_json(exclude_none=True)}\n\n"
    yield "data: [DONE]\n\n"


def _error(exc: GatewayError) -> Any:
    from starlette.responses import JSONResponse

    kind = (
        "invalid_request_error" if exc.status == 400 else "authentication_error" if exc.status == 401 else "api_error"
    )
    return JSONResponse({"error": {"message": str(exc), "type": kind, "code": exc.status}}, status_code=exc.status)
