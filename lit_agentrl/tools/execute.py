"""``execute_python_code``: agentscope's code-execution tool, run in this package's sandbox.

The seed's ``math_code_agent_graph.py`` imports ``execute_python_code`` from agentscope, which runs model-written
code in a plain subprocess of the trainer. This one keeps agentscope's call (``await execute_python_code(code,
timeout=300)``) and result shape (a :class:`ToolResponse` whose ``content`` is a list of text blocks holding
``<returncode>``, ``<stdout>`` and ``<stderr>``; plus ``status``, ``"success"`` or ``"error"``), but runs the code in
a :class:`~lit_agentrl.tools.sandbox.PythonSandbox` (or any :class:`~lit_agentrl.tools.sandbox.CodeRunner`).

Like ``mathcode_agent``, its default sandbox refuses to run without the whole kernel boundary (see docs/sandbox.md)
unless that is accepted: ``allow_weak_sandbox=True`` per call, or once with :func:`set_code_runner`. ``timeout`` can only tighten the sandbox's own wall-clock and CPU limits (a rollout must
not wait 300 s on one tool call because agentscope's default says so); :func:`set_code_runner` sets those limits.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from lit_agentrl.context import report_fault
from lit_agentrl.errors import UserInputError
from lit_agentrl.tools.sandbox import CodeRunner, PythonSandbox, SandboxResult, SandboxUnavailable

__all__ = ["ToolResponse", "execute_python_code", "execute_python_code_sync", "set_code_runner"]


@dataclasses.dataclass
class ToolResponse:
    """A tool's answer in agentscope's shape: ``content`` blocks (``{"type": "text", "text": ...}``), ``status``
    and ``metadata`` (``returncode``, ``stdout``, ``stderr``, ``timed_out``, ``error``)."""

    content: list[dict[str, str]]
    status: Literal["success", "error"]
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def text(self) -> str:
        """The text blocks joined: what a tool node puts in its ``ToolMessage``."""
        return "".join(block["text"] for block in self.content if block.get("type") == "text")

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass
class _Default:
    runner: CodeRunner | None = None
    allow_weak_sandbox: bool = False


_default = _Default()


def set_code_runner(runner: CodeRunner | None = None, *, allow_weak_sandbox: bool = False) -> None:
    """Where :func:`execute_python_code` runs code when a call names no ``runner``: a :class:`PythonSandbox` (its
    limits are the ceiling of every call's ``timeout``) or a remote service's client; None: a default
    ``PythonSandbox()``. ``allow_weak_sandbox`` lets that default sandbox run without the whole kernel boundary."""
    _default.runner = runner
    _default.allow_weak_sandbox = allow_weak_sandbox


async def execute_python_code(code: str, timeout: float = 300, **kwargs: Any) -> ToolResponse:
    """Run ``code`` in the sandbox and return its return code, stdout and stderr (agentscope's signature).

    ``runner=`` (a :class:`CodeRunner`) and ``allow_weak_sandbox=`` override :func:`set_code_runner`'s choice;
    other keyword arguments are accepted and ignored, as agentscope does. Never raises for the code's faults
    (errors, timeouts, limits come back with ``status="error"``); raises :class:`UserInputError` when the default
    sandbox cannot have the whole kernel boundary here and that was not accepted.
    """
    runner = kwargs.get("runner") or _default.runner
    if runner is None:  # the first one probes the machine
        allow_weak = bool(kwargs.get("allow_weak_sandbox", _default.allow_weak_sandbox))
        runner = await asyncio.to_thread(_default_sandbox, allow_weak)
    if isinstance(runner, PythonSandbox):
        return _response(await _with_timeout(runner, timeout).arun(code))
    try:
        result = await asyncio.wait_for(runner.arun(code), timeout)
    except TimeoutError:
        return _error(f"TimeoutError: the code did not finish within {timeout:g} seconds and was stopped.")
    except Exception as exc:  # a remote runner's connection error: an answer for the model, not a crash
        return _error(f"{type(exc).__name__}: {exc}")
    return _response(result)


def execute_python_code_sync(code: str, timeout: float = 300, **kwargs: Any) -> ToolResponse:
    """:func:`execute_python_code`, blocking (from synchronous code; inside a running loop, await the async one)."""
    call = execute_python_code(code, timeout, **kwargs)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call)
    with ThreadPoolExecutor(max_workers=1) as pool:  # called from a coroutine: run on a loop of its own
        return pool.submit(asyncio.run, call).result()


_sandboxes: dict[bool, PythonSandbox] = {}


def _default_sandbox(allow_weak: bool) -> PythonSandbox:
    """``PythonSandbox()`` (once per ``allow_weak``); a refusal is reported as a fault too, then raised."""
    if allow_weak not in _sandboxes:
        try:
            _sandboxes[allow_weak] = PythonSandbox(allow_weak_sandbox=allow_weak)
        except SandboxUnavailable as exc:
            refusal = UserInputError(
                f"execute_python_code: {exc}",
                hint="call lit_agentrl.tools.set_code_runner(allow_weak_sandbox=True) to run with what this "
                "machine allows, install what is missing, or pass a remote runner (see docs/sandbox.md)",
            )
            report_fault(str(refusal))  # an agent that answers any tool error with "tool execute error" still fails
            raise refusal from exc
    return _sandboxes[allow_weak]


def _with_timeout(sandbox: PythonSandbox, timeout: float) -> PythonSandbox:
    """A copy of ``sandbox`` whose wall-clock and CPU limits are at most ``timeout`` seconds."""
    if not timeout > 0:
        raise ValueError(f"execute_python_code: timeout must be positive, got {timeout!r}")
    limits = sandbox.limits
    if timeout >= limits.wall_seconds and timeout >= limits.cpu_seconds:
        return sandbox
    tighter = dataclasses.replace(
        limits, wall_seconds=min(limits.wall_seconds, timeout), cpu_seconds=min(limits.cpu_seconds, timeout)
    )
    clone = copy.copy(sandbox)  # same interpreter and isolation settings (the machine's probe is shared)
    clone.limits = tighter
    return clone


def _response(result: SandboxResult) -> ToolResponse:
    returncode = -1 if result.exit_code is None else result.exit_code
    stderr = result.stderr
    if result.error is not None and returncode <= 0:  # killed, timed out or never started: only ``error`` says so
        stderr = f"{stderr.rstrip()}\n{result.error}" if stderr.strip() else result.error
    text = f"<returncode>{returncode}</returncode><stdout>{result.stdout}</stdout><stderr>{stderr}</stderr>"
    return ToolResponse(
        content=[{"type": "text", "text": text}],
        status="success" if result.ok else "error",
        metadata={
            "returncode": returncode,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "timed_out": result.timed_out,
            "error": result.error,
        },
    )


def _error(message: str) -> ToolResponse:
    return _response(SandboxResult("", "", None, message.startswith("TimeoutError"), False, message))
