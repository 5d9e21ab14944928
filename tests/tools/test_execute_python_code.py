"""``execute_python_code``: agentscope's call and result shape, running in our sandbox."""

from __future__ import annotations

import asyncio

import pytest
from support import without_bubblewrap

from lit_agentrl.errors import UserInputError
from lit_agentrl.tools import (
    PythonSandbox,
    SandboxLimits,
    SandboxResult,
    ToolResponse,
    execute_python_code,
    execute_python_code_sync,
    set_code_runner,
)
from lit_agentrl.tools import execute as execute_module

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=20, output_bytes=4096)


@pytest.fixture(autouse=True)
def fast_sandbox(sandbox_boundary):
    """Calls without ``runner=`` use a sandbox with quick limits; the default comes back afterwards."""
    set_code_runner(PythonSandbox(FAST))
    yield
    set_code_runner(None)


async def test_success_has_returncode_stdout_and_stderr_blocks() -> None:
    result = await execute_python_code("print(6 * 7)")
    assert isinstance(result, ToolResponse) and result.status == "success"
    assert result.content == [
        {"type": "text", "text": "<returncode>0</returncode><stdout>42\n</stdout><stderr></stderr>"}
    ]
    assert str(result) == result.text and result.metadata["returncode"] == 0


async def test_an_exception_is_an_error_response_with_the_traceback() -> None:
    result = await execute_python_code("1 / 0")
    assert result.status == "error" and "<returncode>1</returncode>" in result.text
    assert "ZeroDivisionError" in result.metadata["stderr"] and "ZeroDivisionError" in result.text


async def test_timeout_tightens_the_sandbox_limits() -> None:
    result = await execute_python_code("import time\ntime.sleep(30)", timeout=1)
    assert result.status == "error" and result.metadata["timed_out"]
    assert "TimeoutError" in result.text and "within 1 seconds" in result.text


async def test_the_code_runs_in_the_sandbox_not_the_trainer() -> None:
    result = await execute_python_code("import socket\nsocket.socket()")
    assert result.status == "error" and "PermissionError: sandbox" in result.text


def test_sync_variant_inside_and_outside_a_loop() -> None:
    assert execute_python_code_sync("print('hi')").metadata["stdout"] == "hi\n"

    async def inside() -> ToolResponse:
        return execute_python_code_sync("print('there')")

    assert asyncio.run(inside()).metadata["stdout"] == "there\n"


class _Remote:
    """A remote runner's stand-in: answers, hangs or fails."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def arun(self, code: str) -> SandboxResult:
        if self.mode == "hang":
            await asyncio.sleep(30)
        if self.mode == "fail":
            raise ConnectionError("service down")
        return SandboxResult(stdout="remote\n", stderr="", exit_code=0, timed_out=False, truncated=False, error=None)


@pytest.mark.parametrize(
    ("mode", "status", "needle"),
    [
        ("ok", "success", "<stdout>remote\n</stdout>"),
        ("hang", "error", "TimeoutError"),
        ("fail", "error", "service down"),
    ],
)
async def test_any_code_runner(mode: str, status: str, needle: str) -> None:
    result = await execute_python_code("print(1)", timeout=0.5, runner=_Remote(mode))
    assert result.status == status and needle in result.text


async def test_a_weak_sandbox_is_refused_unless_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    without_bubblewrap(monkeypatch)
    set_code_runner(None)
    with pytest.raises(UserInputError, match=r"missing bwrap.*allow_weak_sandbox"):
        await execute_python_code("print(1)")
    assert (await execute_python_code("print(1)", allow_weak_sandbox=True)).status == "success"


def test_timeout_only_tightens() -> None:
    sandbox = PythonSandbox(FAST)
    assert execute_module._with_timeout(sandbox, 300) is sandbox
    tighter = execute_module._with_timeout(sandbox, 0.5)
    assert (tighter.limits.wall_seconds, tighter.limits.cpu_seconds) == (0.5, 0.5) and sandbox.limits == FAST
    with pytest.raises(ValueError, match="positive"):
        execute_module._with_timeout(sandbox, 0)
