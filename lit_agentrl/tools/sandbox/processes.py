"""The host side of a run: picking its uid, killing what it left, deleting its folder (weak mode)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import random
import signal
import subprocess

from lit_agentrl.tools.sandbox.reaping import Orphans

__all__ = ["UID_SPAN", "kill_by_token", "kill_group", "next_run_number", "own_uid_base", "remove_tree", "uid_base"]

UID_SPAN = 1 << 16
"""How many uids the per-run privilege drop draws from."""
_run_counter = itertools.count(random.randrange(UID_SPAN))


def next_run_number() -> int:
    """A number per run (and per probe): picks the run's uid within ``UID_SPAN`` and goes into its token."""
    return next(_run_counter)


def uid_base(uid_map: str = "/proc/self/uid_map") -> int | None:
    """The first of ``UID_SPAN`` uids this container maps that no account normally uses, or None."""
    try:
        with open(uid_map) as f:
            extents = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except (OSError, ValueError):
        extents = [(0, 0, 2**32 - 1)]
    preferred = 2_000_000_000
    for inside, _outside, length in extents:
        if inside <= preferred and preferred + UID_SPAN <= inside + length:
            return preferred
    best = max(extents, key=lambda e: e[2], default=None)
    if best is None or best[2] < 4 * UID_SPAN:
        return None
    return best[0] + best[2] - 2 * UID_SPAN


@functools.cache
def own_uid_base() -> int | None:
    """:func:`uid_base` of this process's own uid map, read once (a process's map never changes)."""
    return uid_base()


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a run's child leads its own session), if it is still there."""
    with contextlib.suppress(OSError):  # ProcessLookupError, PermissionError: gone, or not ours any more
        os.killpg(pid, signal.SIGKILL)


def kill_by_token(token: str, orphans: Orphans) -> None:
    """SIGKILL every process whose command line carries ``token`` (a run's children, even re-grouped), each
    pinned in ``orphans`` first (it may be left to the trainer to reap) and signalled through its pidfd."""
    needle = token.encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and _carries(int(entry), needle):
            fd = orphans.pin(int(entry), lambda pid: _carries(pid, needle))
            if fd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return needle in f.read()
    except OSError:
        return False


def remove_tree(path: str) -> None:
    """Delete a run's host folder (weak mode) however deep or locked the code made it; never raises.

    coreutils' ``rm`` walks any depth (``shutil.rmtree`` recurses, and a 1,200-deep chain of folders beats
    Python's recursion limit); ``chmod`` first gives back what the code took away (as root ``rm`` needs none)."""
    for command in (["chmod", "-R", "u+rwx", "--", path], ["rm", "-rf", "--one-file-system", "--", path]):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=120, check=False)
