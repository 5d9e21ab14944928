"""The OpenAI-compatible gateway: ``/v1/chat/completions`` and ``/v1/models`` over one rollout engine.

A :class:`Gateway` serves on loopback (uvicorn, a Starlette app) from the rollout's own event loop. The rollout
manager opens a :class:`~lit_agentrl.agents.gateway.session.GatewaySession` per trajectory and hands the agent a base
URL holding its id (``http://127.0.0.1:PORT/t/<id>/v1``; the id also works as the API key at ``/v1``), so
every call is attributed to its trajectory: the handler checks the request (:mod:`.request`), enters the
trajectory's context (its admission tag and sampling parameters), encodes the messages token-exactly
(:mod:`.session`), generates through the engine, parses tool calls with the tool loop's parser, records the sampled
ids and log-probs, and answers with the ``openai`` package's own response types (:mod:`.responses`; streamed as
server-sent events when asked).

Sampling follows the run's parameters as ``ChatModel``'s calls do (``SamplingParams.for_call``): the trainer
computes log-probs at the run's temperature, so a request's ``temperature`` or ``top_p`` that differ are not used (a
warning names them once); ``max_tokens``/``max_completion_tokens`` may only lower the run's per-turn limit, and
``stop`` strings are honoured. ``n`` choices are sampled from the same context, each other than the first into a sample of its own;
``tool_choice`` ``none`` answers in text, and a forced call the reply did not make is counted, never imposed.

Faults: a request the gateway refuses (a bad field, a prompt longer than the engine's context) is a 4xx that leaves
nothing in the trajectory and is counted (``refused_calls``); a call the engine fails is a 500 that also fails the
trajectory, whatever the agent does with the error; a call still in flight when its trajectory ends (or times out)
is cancelled, and with it its engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import uuid
from typing import Any

from jinja2 import TemplateError

from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.agents.gateway.request import SERVED_MODEL, ChatRequest, GatewayError, parse_body, parse_request
from lit_agentrl.agents.gateway.responses import completion, error_response, reply_message, stream_events
from lit_agentrl.agents.gateway.session import GatewaySample, GatewaySession, PlannedCall
from lit_agentrl.context import TrajectoryContext, enter_trajectory
from lit_agentrl.engines import PromptTooLongError, SamplingParams

__all__ = ["Gateway", "GatewayError"]

log = logging.getLogger(__name__)


class Gateway:
    """An OpenAI-compatible HTTP API over ``chat_model``'s engine, for the trajectories of one rollout loop."""

    def __init__(self, chat_model: ChatModel, host: str = "127.0.0.1", port: int = 0) -> None:
        self.chat_model = chat_model
        self.host, self.port = host, port
        self.sessions: dict[str, GatewaySession] = {}
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._warned: set[str] = set()  # what was said once (an unmet tool_choice)
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
            transport = library.ASGITransport(app=self._app, raise_app_exceptions=False)
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
        """End ``session``: later calls get a 401, and calls still in flight are cancelled (their engine requests
        aborted), so nothing of a finished or timed-out trajectory goes on computing."""
        self.sessions.pop(session.id, None)
        session.cancel_calls()

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
            return error_response(exc)
        model = Model(id=SERVED_MODEL, created=0, object="model", owned_by="lit-agentrl")
        return JSONResponse({"object": "list", "data": [model.model_dump()]})

    async def _completions(self, request: Any) -> Any:
        from starlette.responses import Response, StreamingResponse

        try:
            session = self._session(request)
        except GatewayError as exc:
            return error_response(exc)
        try:
            chat = parse_request(parse_body(await request.body()))
            answer = await self._serve(session, chat)
        except GatewayError as exc:
            if exc.status < 500:  # the agent's fault: nothing was recorded, and the trajectory goes on
                session.refused_calls += 1
            return error_response(exc)
        if chat.stream:
            return StreamingResponse(stream_events(answer, chat), media_type="text/event-stream")
        return Response(answer.model_dump_json(exclude_none=True), media_type="application/json")

    async def _serve(self, session: GatewaySession, chat: ChatRequest) -> Any:
        """:meth:`complete` as a task of the session's (closing the session cancels it, and with it the engine's
        request), its faults turned into errors: a prompt over the engine's context a 400, the engine's own a 500 that
        also fails the trajectory."""
        work = asyncio.ensure_future(self.complete(session, chat))
        session.calls_in_flight.add(work)
        try:
            return await work
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # our caller's own cancellation: it goes on up
                raise
            raise GatewayError(
                409, "the trajectory ended while this call was in flight; the call was cancelled"
            ) from None
        except PromptTooLongError as exc:
            raise GatewayError(400, str(exc), "messages", "context_length_exceeded") from None
        except TemplateError as exc:  # the chat template refused the conversation the agent sent
            raise GatewayError(400, f"the model's chat template refused these messages: {exc}", "messages") from None
        except Exception as exc:
            # The engine's fault, not the agent's: the trajectory must not train as if it were fine.
            reason = f"gateway: the engine failed a call ({type(exc).__name__}: {exc})"
            log.warning("%s", reason, exc_info=exc)
            if session.context is not None:
                session.context.faults.append(reason)
            raise GatewayError(500, reason) from exc
        finally:
            session.calls_in_flight.discard(work)

    # ------------------------------------------------------------------------------------------ one call

    async def complete(self, session: GatewaySession, chat: ChatRequest) -> Any:
        """One ``chat.completions`` call of ``session``'s trajectory: generated, then recorded, then answered. Nothing
        is recorded unless every choice was generated."""
        if session.context is not None:
            enter_trajectory(session.context)  # this request's task: the trajectory's tag and sampling params
        params = self._sampling(session, chat)
        call = session.plan(chat.messages, chat.tools, chat.choices, self._renderer(chat), self._suffix(chat))
        try:
            turns = await self._generate(call, chat.tools, params)
            session.commit(call)
        finally:
            session.release(call)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        replies = []
        for index, (sample, turn) in enumerate(zip(call.starts, turns)):
            replies.append(self._record(session, sample, turn, chat.tool_choice))
            # An agent names a choice by "<id>/<index>", or the first by the response's id alone.
            names = [completion_id, f"{completion_id}/0"] if index == 0 else [f"{completion_id}/{index}"]
            sample.completion_ids += names
            sample.reply_of |= dict.fromkeys(names, len(sample.outputs) - 1)
        return completion(completion_id, replies, turns, chat, self.chat_model.tokenizer)

    def _renderer(self, chat: ChatRequest) -> Any:
        return lambda: self.chat_model.render_ids(chat.messages, chat.tools, add_generation_prompt=True)

    def _suffix(self, chat: ChatRequest) -> Any:
        return lambda sample, new: self.chat_model.encode_suffix(new, chat.tools, sample.output_ids)

    async def _generate(
        self, call: PlannedCall, tools: list[dict[str, Any]] | None, params: SamplingParams
    ) -> list[Any]:
        """Each choice's turn; the first failure cancels the others (the call then records nothing)."""
        if len(call.starts) == 1:  # no task to create for the usual call
            return [await self._turn(call.starts[0], call.suffix, tools, params)]
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._turn(start, call.suffix, tools, params)) for start in call.starts]
        except ExceptionGroup as failed:  # the first failure, as one choice's call would raise it
            raise failed.exceptions[0] from None
        return [task.result() for task in tasks]

    async def _turn(
        self, sample: GatewaySample, suffix: list[int], tools: list[dict[str, Any]] | None, params: SamplingParams
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

    def _sampling(self, session: GatewaySession, chat: ChatRequest) -> SamplingParams:
        """The run's parameters with what the call asks for (``SamplingParams.for_call``, ChatModel's policy too): a
        lower ``max_tokens`` and ``stop`` strings are used; a ``temperature`` or ``top_p`` other than the run's is
        not (the trainer's log-probs assume the run's), and a warning says so once."""
        run = session.context.sampling_params if session.context is not None else None
        if run is None:
            raise GatewayError(500, "the trajectory has no sampling parameters (not started by a rollout)")
        asked = {"max_new_tokens": chat.max_tokens, "stop": chat.stop, **chat.asked_sampling}
        return SamplingParams.of(run).for_call({k: v for k, v in asked.items() if v is not None}, "gateway")

    def _record(self, session: GatewaySession, sample: GatewaySample, turn: Any, tool_choice: Any) -> dict[str, Any]:
        """Keep the turn's tokens in ``sample``; the reply as an OpenAI assistant message."""
        meta = turn.response_metadata
        reply = reply_message(turn, meta["raw_text"] if tool_choice == "none" else None)
        if tool_choice not in (None, "auto", "none"):
            self._check_tool_choice(session, reply, tool_choice)
        sample.add_reply(reply, meta, len(turn.tool_calls) + len(turn.invalid_tool_calls))
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
