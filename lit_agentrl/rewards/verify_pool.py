"""Worker processes for checks that can wedge the interpreter, with a hard wall-clock limit per call.

math-verify bounds its work with ``signal.alarm``, which only works on a process's main thread. Off the main
thread (the rollout manager's reward threads, an agent's executor) the check runs unbounded, and some answers
(``9^{9^{9^{9}}}``) keep sympy in C integer arithmetic that holds the interpreter lock: the whole trainer
freezes. A :class:`VerifyPool` runs such a check on the main thread of a separate worker interpreter, where the
alarm works, and the caller waits at most ``hard_limit_s``; past it the worker is killed (SIGKILL needs no
cooperation from code stuck in C) and replaced, and the call raises :class:`VerifyTimeout`.

The workers are fresh interpreters (``python -c``, exec'd at once: nothing of the trainer's threads, CUDA
state or event loops is inherited) that import only the target's module. Not ``multiprocessing``'s spawn
start method: it re-imports the parent's ``__main__`` in every worker, and for the ``lit-agentrl`` console
script that is the whole trainer (measured: ~10 s and torch plus Lightning per worker), or, for a script
without an ``if __name__ == "__main__":`` guard, a second training run.

Lifetime: workers start on a pool's first call; :meth:`VerifyPool.close` (registered with ``atexit`` for every
pool) kills them; a worker whose parent died sees end-of-file on its input and exits, and one busy in a task
when that happens is stopped by a CPU-time limit (``RLIMIT_CPU``) set for each task. POSIX only (as is
math-verify's alarm).
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import wait
from typing import Any

__all__ = ["STARTUP_LIMIT_S", "VerifyPool", "VerifyPoolError", "VerifyTimeout"]

logger = logging.getLogger(__name__)

STARTUP_LIMIT_S = 60.0
"""Longest wait for a new worker to import its target (sympy and math-verify take ~1.5 s; generous for a loaded
machine or a slow file system)."""

_BOOTSTRAP = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from lit_agentrl.rewards.verify_pool import _serve; _serve(sys.argv[2], float(sys.argv[3]))"
)
"""The worker's command line: the parent's ``sys.path`` first (as multiprocessing's spawn does), then serve."""


class VerifyPoolError(RuntimeError):
    """A call got no answer: its worker could not start, crashed, or the pool was closed."""


class VerifyTimeout(VerifyPoolError):
    """A call ran past the pool's hard limit; its worker was killed."""


class _Worker:
    """One worker process and the parent's ends of its pipes (raw descriptors, closed only by :meth:`dispose`)."""

    def __init__(self, target: str, cpu_limit_s: float) -> None:
        to_child_r, self._write_fd = os.pipe()  # non-inheritable: only the worker's own stdin/stdout are passed
        self._read_fd, from_child_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, json.dumps(sys.path), target, str(cpu_limit_s)],
                stdin=to_child_r,
                stdout=from_child_w,
                close_fds=True,
                start_new_session=True,  # a Ctrl-C at the terminal is the trainer's to handle, not the workers'
            )
        except BaseException:
            os.close(self._write_fd)
            os.close(self._read_fd)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._buffer = b""
        self.ready = False

    def wait_ready(self, timeout_s: float) -> None:
        if self.ready:
            return
        try:
            reply = self._read(time.monotonic() + timeout_s)
        except VerifyTimeout:
            raise VerifyPoolError(f"the worker did not start within {timeout_s:.0f}s") from None
        if reply != {"ready": True}:
            raise VerifyPoolError(f"unexpected first message from the worker: {reply!r:.100}")
        self.ready = True

    def call(self, args: tuple[Any, ...], timeout_s: float) -> Any:
        data = json.dumps(list(args)).encode() + b"\n"
        try:
            while data:
                data = data[os.write(self._write_fd, data) :]
        except OSError as exc:  # BrokenPipeError: the worker is gone
            raise VerifyPoolError(f"the worker exited (code {self.proc.poll()})") from exc
        reply = self._read(time.monotonic() + timeout_s)
        if "error" in reply:
            raise VerifyPoolError(f"the target raised {reply['error']}")
        return reply["ok"]

    def _read(self, deadline: float) -> dict[str, Any]:
        """The next line from the worker, as JSON; :class:`VerifyTimeout` past ``deadline``."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not wait([self._read_fd], remaining):  # poll-based: no FD_SETSIZE limit
                raise VerifyTimeout("no answer in time")
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                raise VerifyPoolError(f"the worker exited (code {self.proc.wait()})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply = json.loads(line)
        if not isinstance(reply, dict):
            raise VerifyPoolError(f"unexpected message from the worker: {line[:100]!r}")
        return reply

    def signal_kill(self) -> None:
        """SIGKILL (safe from any thread; the owner of the worker still disposes of it). The alarm inside the
        worker cannot interrupt C code holding the interpreter lock; SIGKILL needs no cooperation."""
        if self.proc.poll() is None:
            self.proc.kill()

    def dispose(self) -> None:
        """Kill, reap and close the pipes; only by the thread that owns the worker. Idempotent."""
        self.signal_kill()
        self.proc.wait()
        self.forget()

    def forget(self) -> None:
        """Close this process's ends of the pipes (alone, in a forked child: the parent's worker is left be)."""
        for fd in (self._write_fd, self._read_fd):
            if fd >= 0:
                os.close(fd)
        self._write_fd = self._read_fd = -1


class VerifyPool:
    """``workers`` worker processes that run ``target`` (``"module:function"``, importable by name; arguments
    and result must be JSON values) on their main thread.

    :meth:`call` takes an idle worker (each worker serves one call at a time; with all busy, callers wait for
    one), sends the arguments and waits at most ``hard_limit_s`` for the result. Past it, only that worker is
    killed and a fresh one started in its place: calls running in the other workers carry on, and calls waiting
    for a worker get the fresh one. So a call waits at most about ``hard_limit_s`` (plus a worker's start) for
    each call ahead of it, and none hangs. Thread-safe. Nothing starts until the first call.
    """

    def __init__(self, target: str, workers: int, hard_limit_s: float) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if hard_limit_s <= 0:
            raise ValueError(f"hard_limit_s must be > 0, got {hard_limit_s}")
        self.target = target
        self.workers = workers
        self.hard_limit_s = hard_limit_s
        self._init_state()
        _POOLS.add(self)

    def _init_state(self) -> None:
        self._lock = threading.Lock()  # guards _started, _closed and _live, and so the starting of workers
        self._started = False
        self._closed = False
        self._live: set[_Worker] = set()  # started and not yet disposed of
        # One entry per worker slot: a started worker, or None for a slot whose worker has not been started
        # (or could not be). A caller owns a slot from get() to put(): one worker serves one call at a time.
        self._slots: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()

    def call(self, *args: Any) -> Any:
        """``target(*args)`` in a worker; :class:`VerifyTimeout` past the hard limit, :class:`VerifyPoolError`
        if the worker crashed, could not start, the target raised, or the pool is closed."""
        self._start()
        worker = self._slots.get()  # each slot comes back within ~STARTUP_LIMIT_S + hard_limit_s
        try:
            if self._closed:
                raise VerifyPoolError("the pool is closed")
            if worker is None or worker.proc.poll() is not None:  # never started, or died while idle
                self._discard(worker)
                worker = None
                worker = self._new_worker()
            worker.wait_ready(STARTUP_LIMIT_S)
            return worker.call(args, self.hard_limit_s)
        except BaseException:
            # A timed-out worker may still be stuck in C code, a crashed one is gone, and after an interrupt its
            # pipe may hold a stale reply: in every case it is killed and replaced, the replacement started now so
            # that its imports overlap whatever comes next. (A target that raised leaves its worker sound, but
            # that is rare enough not to need telling apart.)
            self._discard(worker)
            worker = self._try_new_worker()
            raise
        finally:
            if self._closed:
                self._discard(worker)
                worker = None
            self._slots.put(worker)

    def close(self) -> None:
        """Kill every worker. Calls in flight get :class:`VerifyPoolError` (their worker's pipe closes), and so do
        later calls. Idempotent."""
        with self._lock:
            self._closed = True
            live = list(self._live)
        for worker in live:
            worker.signal_kill()  # a worker in use is disposed of by its caller, who sees end-of-file
        idle: list[_Worker | None] = []
        while True:  # the idle ones are ours to dispose of
            try:
                idle.append(self._slots.get_nowait())
            except queue.Empty:
                break
        for slot in idle:
            self._discard(slot)
            self._slots.put(None)  # for callers waiting on a slot: they find the pool closed

    def _start(self) -> None:
        """On the first call, start every worker at once (without waiting: their imports run in parallel)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        for _ in range(self.workers):
            self._slots.put(self._try_new_worker())

    def _new_worker(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise VerifyPoolError("the pool is closed")
            try:
                worker = _Worker(self.target, cpu_limit_s=2 * self.hard_limit_s + 5)
            except OSError as exc:
                raise VerifyPoolError(f"could not start a worker: {exc}") from exc
            self._live.add(worker)
            return worker

    def _try_new_worker(self) -> _Worker | None:
        try:
            return self._new_worker()
        except VerifyPoolError as exc:  # the slot stays empty; the next call that takes it tries again, and reports
            logger.debug("no replacement worker: %s", exc)
            return None

    def _discard(self, worker: _Worker | None) -> None:
        if worker is not None:
            with self._lock:
                self._live.discard(worker)
            worker.dispose()

    def _forget_after_fork(self) -> None:
        for worker in self._live:
            worker.forget()
        self._init_state()  # the child starts its own workers if it ever calls


_POOLS: weakref.WeakSet[VerifyPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()


def _forget_all_after_fork() -> None:
    # A forked child (a fork-started data loader worker, say) must not talk to the parent's workers (their pipes
    # would carry both processes' messages), nor kill them at its exit; and closing its copies of the pipes lets
    # an idle worker see end-of-file when the parent dies, even while such a child lives on.
    for pool in list(_POOLS):
        pool._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_after_fork)


def _serve(target: str, cpu_limit_s: float) -> None:
    """A worker's main loop: answer each JSON line of arguments on stdin with a JSON line on the saved stdout."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything the target prints goes to stderr, not into the replies
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    _no_core_dumps()
    out.write(b'{"ready": true}\n')
    for line in sys.stdin.buffer:  # ends at end-of-file: the pool closed the pipe, or the parent died
        _limit_cpu(cpu_limit_s)
        try:
            reply: dict[str, Any] = {"ok": function(*json.loads(line))}
        except BaseException as exc:  # math-verify's TimeoutException derives from BaseException
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(reply).encode() + b"\n")


def _no_core_dumps() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, OSError, ValueError):
        pass


def _limit_cpu(seconds: float) -> None:
    """Let the kernel kill this worker (SIGXCPU) ``seconds`` of CPU time from now.

    The parent kills a stuck worker long before; this stops one whose parent died while it was stuck in C code
    (no end-of-file is read then) from spinning on forever.
    """
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime + seconds) + 1
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ImportError, OSError, ValueError):
        pass
