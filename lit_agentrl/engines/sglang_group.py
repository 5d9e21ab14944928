"""Ranks sharing one SGLang engine: ``engine: sglang`` with ``engine.kwargs.tp_size`` > 1 and several ranks per node.

An engine of tensor-parallel size k takes k consecutive GPUs, which k consecutive ranks train on (see
:mod:`lit_agentrl.engines.placement`). The group's first rank starts it as an SGLang HTTP server on those GPUs
(``python -m sglang.launch_server --tp-size k --base-gpu-id <first> --port <port>``; SGLang starts its own
tensor-parallel workers), and every rank of the group, the first included, reaches it through
:class:`~lit_agentrl.engines.sglang_http.SGLangHTTPEngine`: each sends its own prompts, the first alone pushes weights
and releases and resumes memory (``owner``), and the callback's barriers keep the others from generating while
it does.

Ports, per node: the server of the node's i-th group listens on ``group_port + i`` (default 30000 + i) and its
workers rendezvous on ``group_port + 100 + i`` (SGLang would pick that one at random, and two servers started at
the same moment could pick the same).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from lit_agentrl.engines.placement import EnginePlacement

log = logging.getLogger(__name__)
DEFAULT_GROUP_PORT = 30000
STARTUP_TIMEOUT_S = 900.0
LOG_TAIL_LINES = 40


def group_url(placement: EnginePlacement, group_port: int = DEFAULT_GROUP_PORT) -> str:
    """The URL of the server of ``placement``'s group, on this node."""
    return f"http://127.0.0.1:{group_port + placement.local_rank // placement.group_size}"


def server_command(
    model_path: str, seed: int, placement: EnginePlacement, server_args: dict[str, Any], group_port: int
) -> list[str]:
    """The ``sglang.launch_server`` command the group's first rank runs: ``server_args`` (``engine.kwargs`` less
    what the group path sets) as command-line options, ``True`` as a bare flag, ``False``/None left out."""
    index = placement.local_rank // placement.group_size
    options: dict[str, Any] = {
        **server_args,
        "model_path": model_path,
        "tp_size": placement.tp_size,
        "random_seed": seed,
        "skip_tokenizer_init": True,
        "host": "127.0.0.1",
        "port": group_port + index,
        "nccl_port": group_port + 100 + index,
    }
    return [sys.executable, "-m", "sglang.launch_server", *server_flags(options)]


def server_flags(options: dict[str, Any]) -> list[str]:
    """``ServerArgs`` fields as ``sglang.launch_server`` options: ``True`` as a bare flag, ``False``/None left out, a
    list as one option with several values."""
    flags: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, *(str(v) for v in value)] if isinstance(value, (list, tuple)) else [flag, str(value)]
    return flags


class ServerProcess(subprocess.Popen):
    """A server process whose output (stdout and stderr) goes to ``log_path``, whose tail its errors quote."""

    log_path: Path | None = None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's output ("" when it has none)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open(errors="replace") as log_file:
            return "".join(deque(log_file, maxlen=lines))


def start_server(command: list[str], env: dict[str, str] | None = None) -> ServerProcess:
    """Run the server in its own process group (so shutting it down stops its workers too), with ``env`` added to
    this process's environment and its output written to a log file of its own under the temporary directory."""
    fd, path = tempfile.mkstemp(prefix="sglang-server-", suffix=".log")
    log.info("starting an SGLang server (its output in %s): %s", path, " ".join(command))
    with os.fdopen(fd, "wb") as log_file:
        server = ServerProcess(
            command,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server.log_path = Path(path)
    return server


def wait_until_healthy(url: str, server: subprocess.Popen | None, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Poll ``url/health`` until it answers 200; raise if the server process exits first or ``timeout_s`` passes,
    quoting the end of the server's log when it has one."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"the SGLang server at {url} exited with code {server.returncode}{_quoted_log(server)}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise TimeoutError(
        f"the SGLang server at {url} did not become healthy within {timeout_s:.0f} s{_quoted_log(server)}"
    )


def _quoted_log(server: subprocess.Popen | None) -> str:
    if not isinstance(server, ServerProcess) or not (tail := server.log_tail()):
        return ""
    return f"; the end of its log ({server.log_path}):\n{tail}"


def stop_server(server: subprocess.Popen) -> None:
    """Terminate the server's process group (its workers too), then kill what is left after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
