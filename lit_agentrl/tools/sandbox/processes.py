"""The host side of a run: picking its uid, counting a user's tasks, killing what it left, deleting its folder."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
from typing import Any

__all__ = ["UID_SPAN", "kill_by_token", "kill_group", "next_run_number", "remove_tree", "uid_base", "user_task_count"]

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


def user_task_count(uid: int) -> int:
    """Tasks (processes and threads) of ``uid`` now: what ``RLIMIT_NPROC`` compares with."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields.get("Threads", "1"))
        except (OSError, ValueError, KeyError):
            continue
    return count


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a run's child leads its own session), if it is still there."""
    with contextlib.suppress(OSError):  # ProcessLookupError, PermissionError: gone, or not ours any more
        os.killpg(pid, signal.SIGKILL)


def kill_by_token(token: str) -> None:
    """SIGKILL every process whose command line carries ``token`` (a run's children, even re-grouped)."""
    needle = token.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def remove_tree(path: str) -> None:
    """Delete a run's directory, even where the code took away its own permissions."""

    def retry(func: Any, target: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)
