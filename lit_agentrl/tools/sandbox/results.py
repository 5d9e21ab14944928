"""What a run gives back: :class:`SandboxResult`, built from the child's exit status and captured output.

Also :class:`CodeRunner`, the protocol every code runner (the local sandbox or a remote service's client)
satisfies, and :class:`OutputCapture`, which keeps a bounded part of a stream.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lit_agentrl.tools.sandbox.limits import SandboxLimits

__all__ = ["FLOOD_FACTOR", "CodeRunner", "OutputCapture", "SandboxResult", "failure", "result_from_exit"]

FLOOD_FACTOR = 64
"""Output beyond this many times ``output_bytes`` (stdout and stderr together) stops the run: the parent's own
CPU per run stays bounded however much the code prints."""


@dataclass
class SandboxResult:
    """What a run produced. ``error`` is None exactly when the code ran to the end and exited with 0."""

    stdout: str
    """Standard output (its first ``output_bytes``; a marker says when more was dropped)."""
    stderr: str
    """Standard error (its last ``output_bytes``; a marker says when earlier bytes were dropped)."""
    exit_code: int | None
    """The process's exit status; negative: killed by that signal; None: it never started."""
    timed_out: bool
    """True when the wall-clock limit killed it."""
    truncated: bool
    """True when output beyond ``output_bytes`` was discarded."""
    error: str | None
    """A description for the model: the traceback's tail, a timeout or limit, a setup failure."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_tool_text(self) -> str:
        """What the model sees: stdout on success, else what was printed followed by the error."""
        if self.error is None:
            return self.stdout.rstrip() if self.stdout.strip() else "(no output: print() the values you need)"
        printed = self.stdout.rstrip()
        return f"{printed}\n{self.error}" if printed else self.error


@runtime_checkable
class CodeRunner(Protocol):
    """Runs a piece of Python code; :class:`PythonSandbox` is one, a remote sandbox client can be another.

    For untrusted code in production, run it in a separate, disposable machine or container. Anything with
    ``async def arun(self, code: str) -> SandboxResult`` can be passed to the ``mathcode_agent`` instead of a
    :class:`PythonSandbox`::

        class RemoteRunner:
            def __init__(self, url): self.client = httpx.AsyncClient(base_url=url)
            async def arun(self, code: str) -> SandboxResult:
                reply = (await self.client.post("/run", json={"code": code}, timeout=30)).json()
                return SandboxResult(stdout=reply["stdout"], stderr=reply["stderr"], exit_code=reply["exit_code"],
                                     timed_out=reply["timed_out"], truncated=False, error=reply.get("error"))

    (or set ``code_runner: "my_pkg.remote:make_runner"`` in the agent's YAML).
    """

    async def arun(self, code: str) -> SandboxResult: ...


class OutputCapture:
    """Keeps the head (stdout) or the tail (stderr) of a stream, at most ``limit`` bytes, and counts the rest."""

    def __init__(self, limit: int, tail: bool = False) -> None:
        self.limit, self.tail = limit, tail
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        if self.tail:
            self.data += chunk
            extra = len(self.data) - self.limit
            if extra > 0:
                del self.data[:extra]
                self.dropped += extra
        else:
            room = max(self.limit - len(self.data), 0)
            self.data += chunk[:room]
            self.dropped += max(len(chunk) - room, 0)

    def text(self) -> str:
        body = self.data.decode("utf-8", "replace")
        if not self.dropped:
            return body
        if self.tail:
            return f"[... {self.dropped} earlier bytes of stderr not shown ...]\n{body}"
        return f"{body}\n[... output truncated: {self.dropped} more bytes not shown ...]"


def failure(error: str) -> SandboxResult:
    """The result of a run that never started (bad input, or the machine could not prepare it)."""
    return SandboxResult(stdout="", stderr="", exit_code=None, timed_out=False, truncated=False, error=error)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def result_from_exit(
    code: int | None,
    timed_out: bool,
    out: OutputCapture,
    err: OutputCapture,
    limits: SandboxLimits,
    *,
    flooded: bool = False,
    out_of_memory: bool = False,
    sandbox_error: str | None = None,
) -> SandboxResult:
    """The result of a finished run: the code's exit status (or the signal that killed it, or why the parent
    stopped it, or ``sandbox_error``: what the sandbox's own side failed at) turned into ``error``. Only the
    parent's knowledge and the run's verdict (:mod:`.verdict`) decide these, never the code's output."""
    stdout, stderr = out.text(), err.text()
    error: str | None = None
    if flooded:
        error = (
            f"OutputError: the code printed more than {FLOOD_FACTOR * limits.output_bytes} bytes and was stopped "
            f"(only the first {limits.output_bytes} bytes of stdout are kept: print less)."
        )
    elif timed_out:
        error = f"TimeoutError: the code did not finish within {limits.wall_seconds:g} seconds and was stopped."
    elif sandbox_error is not None:
        error = f"SandboxError: {sandbox_error}"
    elif code == -signal.SIGXCPU:
        error = f"TimeoutError: the code used more than {limits.cpu_seconds:g} seconds of CPU time and was stopped."
    elif out_of_memory and code is not None and code != 0:
        error = (
            f"MemoryError: the code used more than its {limits.memory_mb} MB of memory (counting the files it "
            "wrote) and was stopped."
        )
    elif code == -signal.SIGKILL:
        error = "Killed: the code exceeded its CPU time or memory limit and was stopped."
    elif code is not None and code < 0:
        error = f"Killed by {signal_name(-code)}." + (f"\n{tail(stderr)}" if stderr.strip() else "")
    elif code != 0:
        error = tail(stderr.strip()) or f"the code exited with status {code}"
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=code,
        timed_out=timed_out,
        truncated=bool(out.dropped or err.dropped),
        error=error,
    )
