"""The transformers engine in a process of its own (``engine: transformers_process``).

In one process, a rollout running beside the trainer (``RolloutCallback(mode="async")``) shares the trainer's
interpreter lock: on CPU, where a small model's generation and training are both mostly Python, the two sides then
take turns rather than overlap. Here the engine (:class:`~lit_agentrl.engines.hf.TransformersEngine`, unchanged)
runs in a spawned process, with torch threads of its own, and :class:`ProcessEngine` forwards the engine API to it
over a pipe:

* a generation request goes out as one message per sample, with its sampling stream keyed here exactly as the
  in-process engine keys it (trajectory, turn), so both engines sample the same tokens for the same rollout;
* answers come back on a reader thread, which records each trajectory's weight version (the engine reports it with
  every answer, as SGLang does) and hands the answer to the caller's event loop;
* a request whose caller stops waiting (a trajectory's timeout cancels its task) is aborted in the engine process:
  an ``abort`` message names it, and the engine drops it from its queue or running batch;
* weight updates, pauses (``partial_rollouts``), reseeds and flushes are calls answered in order.

If the process dies, every request in flight and every later call fails with its exit code: never a hang.
``deterministic: true`` is refused: its admission gate lives in the rollout manager's process.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import itertools
import logging
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from multiprocessing.connection import Connection
from typing import Any, cast

import torch
import torch.multiprocessing

from lit_agentrl.context import TrajectoryTag, current_tag
from lit_agentrl.engines.registry import register_engine
from lit_agentrl.engines.requests import QueuedEngine, StreamKeys, split_requests
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.dtypes import torch_dtype

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0
"""How long the engine process may take to import torch and load the model before the start counts as failed."""

_CALLS = (
    "update_weights_from_tensor",
    "begin_weight_update",
    "end_weight_update",
    "reseed",
    "flush_cache",
    "get_weights_by_name",
    "release_memory_occupation",
    "resume_memory_occupation",
)
"""The engine methods the parent may call in the engine process (besides generation, the weight version's setter
and shutdown)."""
_WAITS = ("wait_for_sampled_tokens", "wait_for_aborted_requests")
"""Engine methods that block until something happens: answered from a thread of their own, so that the process
keeps taking messages meanwhile."""


@register_engine("transformers_process")
class ProcessEngine(QueuedEngine):
    """:class:`~lit_agentrl.engines.hf.TransformersEngine` in a spawned process: the same arguments, plus
    ``threads`` (the process's torch threads; default: the caller's ``torch.get_num_threads()``).

    Example (a config)::

        callbacks:
          - class_path: lit_agentrl.callbacks.RolloutCallback
            init_args: {engine: {name: transformers_process, kwargs: {threads: 1}}, async_rollouts: {ahead: 1}}
    """

    generates_beside_trainer = True
    updates_while_generating = True

    def __init__(self, model_path: str, seed: int = 0, threads: int | None = None, **engine_kwargs: Any) -> None:
        if engine_kwargs.get("deterministic"):
            raise UserInputError(
                "engine.kwargs.deterministic: true needs the engine in the trainer's process (its admission gate is "
                "the rollout manager's)",
                hint="use engine: transformers for deterministic admission, or drop deterministic",
            )
        if threads is not None and threads < 1:
            raise UserInputError(f"engine.kwargs.threads must be >= 1, got {threads}")
        self.model_path = model_path
        self.weight_dtype = torch_dtype(engine_kwargs.get("dtype", "float32"), where="engine.kwargs.dtype")
        self.context_length: int | None = None  # the engine process's, once it has loaded the model
        self.streams = StreamKeys(seed)  # keyed here exactly as the in-process engine keys them
        self._weight_version = 0
        self._busy_seconds = 0.0
        self._sampled_tokens = 0
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._pending_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._dead: str | None = None  # why the process can no longer answer
        context = torch.multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        engine_args = dict(engine_kwargs, seed=seed)
        threads = threads or torch.get_num_threads()
        self._process = context.Process(
            target=serve, args=(child_end, model_path, threads, engine_args), name="lit-agentrl-engine", daemon=True
        )
        self._process.start()
        child_end.close()
        self._await_ready()
        self._reader = threading.Thread(target=self._read_answers, name="ProcessEngine-reader", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------------ the engine API

    @property
    def seed(self) -> int:
        """The seed of the untagged sampling streams (set by :meth:`reseed`)."""
        return self.streams.seed

    @property
    def busy_seconds(self) -> float:  # type: ignore[override]
        """The engine process's model compute so far, as of its last answer."""
        return self._busy_seconds

    @property
    def sampled_tokens(self) -> int:
        """Tokens the engine process has sampled in all, as of its last answer."""
        return self._sampled_tokens

    @property
    def weight_version(self) -> int:
        return self._weight_version

    @weight_version.setter
    def weight_version(self, version: int) -> None:  # set inside a weight-update session: the process's too
        self._call("set_weight_version", version)
        self._weight_version = version

    def update_weights_from_tensor(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> tuple[bool, str]:
        # Copies: sending a tensor moves its storage into shared memory, which must never be the trainer's own.
        pairs = [(name, tensor.detach().clone()) for name, tensor in named_tensors]
        return cast("tuple[bool, str]", self._call("update_weights_from_tensor", pairs, load_format, flush_cache))

    def begin_weight_update(self) -> None:
        self._call("begin_weight_update")

    def end_weight_update(self) -> None:
        self._call("end_weight_update")

    def reseed(self, seed: int) -> None:
        self.streams.reseed(seed)
        self._call("reseed", seed)

    def flush_cache(self) -> bool:
        return bool(self._call("flush_cache"))

    def wait_for_sampled_tokens(self, count: int, timeout: float | None = None) -> bool:
        """Block until the engine process has sampled ``count`` tokens in all (False: timed out, or shut down)."""
        return bool(self._call("wait_for_sampled_tokens", count, timeout))

    def wait_for_aborted_requests(self, count: int, timeout: float | None = None) -> bool:
        """Block until the engine process has aborted ``count`` requests in all (False: timed out, or shut down)."""
        return bool(self._call("wait_for_aborted_requests", count, timeout))

    def get_weights_by_name(self, name: str) -> torch.Tensor:
        """A copy of one of the engine process's weights (for tests)."""
        return cast("torch.Tensor", self._call("get_weights_by_name", name))

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._call("release_memory_occupation", tags)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._call("resume_memory_occupation", tags)

    def shutdown(self) -> None:
        """Stop the engine process (requests in flight fail); waits for it to exit."""
        if self._dead is None:
            with contextlib.suppress(RuntimeError):  # it died on the way out: the join below still reaps it
                self._call("shutdown", timeout=60)
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10)
        self._fail_all("the engine process was shut down")

    # ------------------------------------------------------------------ requests

    def _submit(
        self,
        input_ids: list[int] | list[list[int]] | None,
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None,
        return_logprob: bool,
        extra: dict[str, Any],
    ) -> tuple[list[concurrent.futures.Future], bool]:
        requests, batched = split_requests("ProcessEngine", input_ids, sampling_params, extra, self.context_length)
        tag = current_tag()
        futures = []
        for request in requests:
            params = {key: value for key, value in request.sampling_params.items() if key != "n"}  # the wire form
            for _ in range(request.params.n):
                stream, _ = self.streams.next(tag)
                payload = (request.prompt, params, return_logprob, request.image_data, stream)
                futures.append(self._send_request(tag, payload))
        return futures, batched or len(futures) > 1

    def _send_request(self, tag: TrajectoryTag | None, request: tuple[Any, ...]) -> concurrent.futures.Future:
        request_id, future = self._open()
        self._transmit(request_id, "generate", request)
        future.add_done_callback(functools.partial(self._abort_if_cancelled, request_id))
        if tag is not None:
            tag.gate.submitted(tag.key)

            def answered(done: concurrent.futures.Future) -> None:  # before the caller wakes: added first
                if not done.cancelled() and done.exception() is None:
                    tag.gate.note_version(tag.key, done.result()["meta_info"]["weight_version"])
                tag.gate.answered(tag.key)

            future.add_done_callback(answered)
        return future

    # ------------------------------------------------------------------ the pipe

    def _call(self, op: str, *args: Any, timeout: float | None = None) -> Any:
        return self._send(op, args).result(timeout=timeout)

    def _send(self, op: str, payload: Any) -> concurrent.futures.Future:
        request_id, future = self._open()
        self._transmit(request_id, op, payload)
        return future

    def _open(self) -> tuple[int, concurrent.futures.Future]:
        """A new message's id, and the future its answer will resolve."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._pending_lock:
            if self._dead is not None:
                raise RuntimeError(self._dead)
            request_id = next(self._ids)
            self._pending[request_id] = future
        return request_id, future

    def _transmit(self, request_id: int, op: str, payload: Any) -> None:
        try:
            with self._send_lock:
                self._connection.send((request_id, op, payload))
        except (OSError, EOFError) as exc:
            self._fail_all(f"the engine process cannot be reached ({exc}){self._exit_note()}")

    def _abort_if_cancelled(self, request_id: int, future: concurrent.futures.Future) -> None:
        """A generation its caller stopped waiting for: abort it in the engine process (its answer is not awaited)."""
        if not future.cancelled():
            return
        with self._pending_lock:
            self._pending.pop(request_id, None)
        with contextlib.suppress(RuntimeError):  # a dead process computes nothing more
            self._send("abort", request_id)

    def _await_ready(self) -> None:
        if not self._connection.poll(STARTUP_TIMEOUT_S):
            self._process.kill()
            raise RuntimeError(f"the engine process did not load {self.model_path!r} in {STARTUP_TIMEOUT_S:.0f} s")
        try:
            status, detail = self._connection.recv()
        except EOFError:
            status, detail = "error", f"it exited before loading the model{self._exit_note()}"
        if status == "ready":
            self.context_length = detail
            return
        self._process.join(timeout=10)
        if isinstance(detail, BaseException):
            raise detail
        raise RuntimeError(f"the engine process failed to start: {detail}")

    def _read_answers(self) -> None:
        while True:
            try:
                request_id, ok, value, busy, sampled = self._connection.recv()
            except (EOFError, OSError):
                self._fail_all(f"the engine process died{self._exit_note()}")
                return
            self._busy_seconds, self._sampled_tokens = busy, sampled
            with self._pending_lock:
                future = self._pending.pop(request_id, None)
            if future is None or future.done():  # cancelled by its caller (a trajectory's timeout)
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _fail_all(self, why: str) -> None:
        with self._pending_lock:
            self._dead = self._dead or why
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(RuntimeError(self._dead))

    def _exit_note(self) -> str:
        self._process.join(timeout=5)
        code = self._process.exitcode
        return "" if code is None else f" (exit code {code})"


# ---------------------------------------------------------------------- the engine process


def serve(connection: Connection, model_path: str, threads: int, engine_args: dict[str, Any]) -> None:
    """The engine process: load the engine, then answer the parent's messages until it says ``shutdown`` or goes."""
    torch.set_num_threads(threads)
    from lit_agentrl.engines.hf import TransformersEngine

    try:
        engine = TransformersEngine(model_path, **engine_args)
    except BaseException as exc:  # the parent re-raises it: a bad setting reads as it would in-process
        connection.send(("error", _picklable(exc)))
        return
    connection.send(("ready", engine.context_length))
    send_lock = threading.Lock()
    running: dict[int, concurrent.futures.Future] = {}  # generations in flight, by the parent's message id

    def reply(request_id: int, ok: bool, value: Any) -> None:
        with send_lock:
            connection.send(
                (request_id, ok, value if ok else _picklable(value), engine.busy_seconds, engine.sampled_tokens)
            )

    calls: dict[str, Callable[..., Any]] = {name: getattr(engine, name) for name in _CALLS + _WAITS}
    calls["set_weight_version"] = lambda version: setattr(engine, "weight_version", version)
    while True:
        try:
            request_id, op, payload = connection.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if op == "shutdown":
            engine.shutdown()
            reply(request_id, True, None)
            break
        try:
            if op == "generate":
                future = engine.submit_with_stream(*payload)
                running[request_id] = future
                future.add_done_callback(functools.partial(_reply_with, reply, running, request_id))
            elif op == "abort":  # a cancelled future leaves the engine's queue or running batch at its next step
                aborted = running.pop(payload, None)
                reply(request_id, True, aborted is not None and aborted.cancel())
            elif op in _WAITS:
                args = (reply, request_id, calls[op], payload)
                threading.Thread(target=_answer_when_done, args=args, name=op, daemon=True).start()
            elif op in calls:
                reply(request_id, True, calls[op](*payload))
            else:
                raise ValueError(f"the engine process has no call {op!r}")
        except Exception as exc:
            reply(request_id, False, exc)
    engine.shutdown()


def _reply_with(
    reply: Callable[[int, bool, Any], None],
    running: dict[int, concurrent.futures.Future],
    request_id: int,
    future: concurrent.futures.Future,
) -> None:
    running.pop(request_id, None)
    if future.cancelled():  # aborted: the parent no longer waits for it
        return
    error = future.exception()
    reply(request_id, error is None, future.result() if error is None else error)


def _answer_when_done(
    reply: Callable[[int, bool, Any], None], request_id: int, call: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    try:
        value = call(*args)
    except Exception as exc:
        reply(request_id, False, exc)
        return
    reply(request_id, True, value)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its traceback."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(exc))
        return RuntimeError(f"in the engine process: {text}")
