"""What the sandbox's own side of a run says happened, read from a channel the code cannot write.

The parent passes each run the write end of a pipe of its own (the verdict descriptor). On it:

* the child's stage writes ``{"setup": "ok"}`` and closes it just before the code runs, or
  ``{"setup": "failed", "error": ...}`` and ends;
* inside bubblewrap, the run's supervisor (PID 1 of its namespace, which the code cannot signal, trace or read,
  see :func:`.stage.supervise`) writes the code's real wait status, ``{"exit": N}`` or ``{"signal": N}``.

Nothing else is believed: an exit status of 113 with the stage's old message on stderr is the code's exit status,
and so is ``exit(152)`` (bubblewrap reports a signal death as ``128 + N``, which such an exit forges). Without
bubblewrap the code's interpreter is the parent's own child, whose wait status the parent gets from the kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass

__all__ = ["MAX_VERDICT_BYTES", "Verdict", "outcome", "parse_verdict", "read_verdict"]

MAX_VERDICT_BYTES = 65536
"""More than the stage and the supervisor ever write; anything past it is not read."""


@dataclass(frozen=True)
class Verdict:
    """The run as its trusted side reported it."""

    started: bool
    """The stage finished its setup and went on to run the code."""
    setup_error: str | None = None
    """What the stage's setup failed at (the code never ran)."""
    status: int | None = None
    """The code's process as the supervisor saw it end: its exit status, or minus the signal that killed it;
    None without a supervisor's report (no bubblewrap, or the run was killed first)."""


def parse_verdict(data: bytes) -> Verdict:
    """The records of one run, in the order they were written (see the module's docstring)."""
    started, error, status = False, None, None
    for line in data.decode("ascii", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a record cut short by a kill: as if it were not written
        if not isinstance(record, dict):
            continue
        if record.get("setup") == "ok":
            started = True
        elif record.get("setup") == "failed":
            error = str(record.get("error") or "the sandbox's setup failed")
        elif isinstance(record.get("exit"), int):
            status = record["exit"]
        elif isinstance(record.get("signal"), int):
            status = -record["signal"]
    return Verdict(started=started and error is None, setup_error=error, status=status)


def read_verdict(fd: int) -> Verdict:
    """What is in the pipe now: the run has ended, so every writer has written (or died without writing)."""
    os.set_blocking(fd, False)
    chunks, size = [], 0
    with contextlib.suppress(BlockingIOError):
        while size < MAX_VERDICT_BYTES:
            chunk = os.read(fd, MAX_VERDICT_BYTES - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    return parse_verdict(b"".join(chunks))


def outcome(verdict: Verdict, returncode: int | None, *, bwrap: bool, killed: bool) -> tuple[int | None, str | None]:
    """The code's exit status (minus the signal that killed it), and the sandbox's own failure if there was one.
    Only the verdict and the kernel's wait status of the trainer's own child (the launcher's ``returncode``; the
    code's interpreter itself without bubblewrap) are believed; a run the parent killed (``killed``: a timeout, a
    flood, the memory limit) may end before either speaks."""
    if verdict.setup_error is not None:
        return returncode, verdict.setup_error
    if not verdict.started:
        return returncode, None if killed else "the boundary did not start the run"
    if not bwrap:
        return returncode, None  # the code's interpreter was the trainer's own child
    if verdict.status is not None:
        return verdict.status, None
    return -signal.SIGKILL, None if killed else "the run ended without its supervisor's report"
