"""A separate program as the agent: the built-in ``openai_command`` agent.

Rows name ``agent_name: openai_command``, and the agent YAML holds ``command: [python, my_agent.py, ...]``. The
program runs once per trajectory with ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` pointing at the trajectory's
gateway and the row as JSON on stdin (see :func:`run_command`). It runs in a process group of its own: when it exits,
or its trajectory ends or times out, the whole group is killed, so no child it started outlives its trajectory or
holds the rollout up by keeping a pipe open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import Any

from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.openai_client import AgentResult, register_openai_agent

__all__ = ["COMMAND_KEY", "command_result", "resolved_command", "run_command", "run_program", "stderr_tail"]

COMMAND_KEY = "command"
"""The agent YAML key of ``openai_command``: the program to run per trajectory, as an argv list."""
RESULT_KEYS = frozenset({"reward", "final_answer", "metrics", "sequence_rewards", "turn_rewards"})
"""The keys a program's JSON result line may hold."""
KEPT_OUTPUT_BYTES = 1 << 20
"""The most of each of stdout and stderr kept (the end of it): a program that floods its output cannot fill memory."""
PIPE_GRACE_S = 5.0
"""How long the output may still flow after the program's group was killed (a descendant that left the group may
hold a pipe open); then the pipes are closed."""
PYTHON_NAMES = ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}")
"""A ``command`` starting with one of these runs under the trainer's own interpreter, whatever ``PATH`` holds."""


def resolved_command(command: Any) -> list[str]:
    """The agent YAML's ``command`` checked, with ``python`` resolved to the trainer's interpreter."""
    if not command or isinstance(command, str) or not all(isinstance(part, str) for part in command):
        raise ValueError(f"openai_command: the agent YAML needs `{COMMAND_KEY}:` as a list of strings, got {command!r}")
    return [sys.executable if command[0] in PYTHON_NAMES else command[0], *command[1:]]


@register_openai_agent("openai_command")
async def run_command(client: Any, row: dict[str, Any], cfg: Any) -> AgentResult | None:
    """Run the agent YAML's ``command`` for one trajectory. Its stdout's last non-empty line is its result: a number
    (the reward), ``null`` or a JSON object with ``reward``, ``final_answer``, ``metrics``, ``sequence_rewards`` and ``turn_rewards``;
    with no output at all, the row's reward function scores the last reply. Any other last line, or a non-zero exit,
    fails the trajectory, quoting the line or the program's stderr."""
    command = resolved_command(cfg_get(cfg, COMMAND_KEY, None))
    env = {**os.environ, "OPENAI_BASE_URL": str(client.base_url), "OPENAI_API_KEY": str(client.api_key)}
    status, out, err = await run_program(command, json.dumps(row, default=str).encode(), env)
    if status != 0:
        raise RuntimeError(f"openai_command {command[0]!r} exited with status {status}: {stderr_tail(err)}")
    return command_result(out.decode(errors="replace"), command[0])


class _Program(asyncio.SubprocessProtocol):
    """The program's output (the end of each stream) and the moments it exits and its pipes close."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.output = {1: bytearray(), 2: bytearray()}
        self.exited = loop.create_future()
        self.closed = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = self.output[fd]
        kept += data
        del kept[:-KEPT_OUTPUT_BYTES]

    def process_exited(self) -> None:
        self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set_result(None)


async def run_program(
    command: list[str], stdin: bytes, env: dict[str, str], terminate_grace_s: float = 0.0
) -> tuple[int, bytes, bytes]:
    """Run ``command`` in a new process group with ``stdin``; its exit status, stdout and stderr. The group is killed
    once the program exits or this call is cancelled (its trajectory timed out), whichever comes first; with
    ``terminate_grace_s``, a cancelled program is first sent SIGTERM and given that long to clean up (to stop what
    it started outside its group)."""
    loop = asyncio.get_running_loop()
    transport, program = await loop.subprocess_exec(
        lambda: _Program(loop),
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own session and process group, whose id is its pid
    )
    try:
        feed = transport.get_pipe_transport(0)
        assert isinstance(feed, asyncio.WriteTransport)
        with contextlib.suppress(OSError):  # a program that never reads its stdin may exit before taking it all
            feed.write(stdin)
            feed.write_eof()
        await asyncio.shield(program.exited)  # shielded: a cancelled wait leaves it pending, for the grace below
        _kill_group(transport.get_pid())  # what it left running goes with it, and their pipes close
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(program.closed), PIPE_GRACE_S)
    except BaseException:
        if terminate_grace_s > 0 and not program.exited.done():
            _kill_group(transport.get_pid(), signal.SIGTERM)
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(program.exited), terminate_grace_s)
        raise
    finally:
        _kill_group(transport.get_pid())
        transport.close()
    status = transport.get_returncode()
    assert status is not None
    return status, bytes(program.output[1]), bytes(program.output[2])


def stderr_tail(stderr: bytes) -> str:
    """The end of a program's stderr, where its error is (its log lines precede it)."""
    return stderr.decode(errors="replace").strip()[-2000:]


def _kill_group(pid: int, signal_number: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal_number)


def command_result(stdout: str, program: str = "the program") -> AgentResult | None:
    """The result a program printed as its stdout's last non-empty line (see :func:`run_command`)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    last, problem = lines[-1], ""
    with contextlib.suppress(ValueError):  # not JSON: refused below, quoting it
        value = json.loads(last)
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return AgentResult(reward=float(value))
        if isinstance(value, dict) and set(value) <= RESULT_KEYS:
            try:
                return _result(value)
            except (TypeError, ValueError) as exc:
                problem = f" ({exc})"
        elif isinstance(value, dict):
            problem = f" (unknown keys {sorted(set(value) - RESULT_KEYS)})"
    shown = last if len(last) <= 200 else f"{last[:200]}..."
    raise ValueError(
        f"openai_command {program!r}: the last line of its output must be a number, null or a JSON object of "
        f"{sorted(RESULT_KEYS)}{problem}; it printed: {shown!r}"
    )


def _result(value: dict[str, Any]) -> AgentResult:
    reward, answer = value.get("reward"), value.get("final_answer")
    if answer is not None and not isinstance(answer, str):
        raise TypeError(f"final_answer must be a string, got {answer!r}")
    return AgentResult(
        reward=None if reward is None else float(reward),
        final_answer=answer,
        metrics={str(k): float(v) for k, v in (value.get("metrics") or {}).items()},
        sequence_rewards={str(k): float(v) for k, v in (value.get("sequence_rewards") or {}).items()},
        turn_rewards={str(k): float(v) for k, v in (value.get("turn_rewards") or {}).items()},
    )
