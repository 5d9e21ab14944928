"""Reaping what a run leaves to the trainer: no zombie, even where the trainer is PID 1 of its PID namespace.

A process whose parent dies goes to the nearest ancestor that is a child subreaper, else to PID 1, which must
wait for it or it stays a zombie. When a run is killed, bubblewrap's monitor can die before the run's PID 1
(the supervisor), which then goes to the trainer; without bubblewrap, what the code forked goes there too.
A trainer started as a container's first process (``docker run ... python train.py``) is that PID 1 and
nothing in Python waits for such processes, so each killed run left one zombie, and a long run would use up
the PID space. :func:`become_subreaper` makes the trainer the reaper of everything below it wherever it runs,
and :class:`Orphans` waits for the run's processes.

Which processes to wait for. ``waitpid(-1)`` or ``waitid(P_ALL)`` would also take the exit status of children
the trainer waits for itself (``subprocess``, asyncio's subprocesses, ``multiprocessing``), which then hang or
fail. So only processes positively known to be a run's are waited for, each through a pidfd opened while it
was known to be the run's: ``waitid(P_PIDFD)`` waits for exactly that process, never for another that was
given its number later, and only once it is the trainer's child. A process is known to be a run's when it is
in the run's cgroup (read just before the run is killed), carries the run's token in its command line, or is
the PID 1 bubblewrap reported for the run and is still the init of a nested PID namespace whose parent is the
monitor or the trainer (checked after the pidfd is open, so its number cannot have moved on). Orphans of the
trainer's other children also come to a subreaper; those are left alone: nothing says whose they are.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable

__all__ = ["Orphans", "become_subreaper", "is_nested_init", "pin_bwrap_init", "reap_run"]

PR_SET_CHILD_SUBREAPER = 36
_subreaper_lock = threading.Lock()
_subreaper: list[bool] = []


def become_subreaper() -> None:
    """Make this process a child subreaper (once; ``prctl(PR_SET_CHILD_SUBREAPER, 1)``); OSError if refused."""
    with _subreaper_lock:
        if _subreaper:
            return
        libc, ulong = ctypes.CDLL(None, use_errno=True), ctypes.c_ulong
        if libc.prctl(PR_SET_CHILD_SUBREAPER, ulong(1), ulong(0), ulong(0), ulong(0)):
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")
        _subreaper.append(True)


def is_nested_init(pid: int, parents: tuple[int, ...]) -> bool:
    """Whether ``pid`` is PID 1 of a PID namespace below this one and a child of one of ``parents``."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        levels = fields["NSpid"].split()
        return len(levels) > 1 and levels[-1] == "1" and int(fields["PPid"]) in parents
    except (OSError, KeyError, ValueError):
        return False


def pin_bwrap_init(orphans: Orphans, info_fd: int, monitor: int) -> None:
    """Pin the run's PID 1, whose pid bubblewrap's monitor wrote to ``--info-fd`` as the run started: it becomes
    the trainer's child when the monitor dies first (the run was killed). Its number, read late, may since have
    gone to another process, so it is pinned only while it is a namespace's init whose parent is ``monitor`` or
    the trainer."""
    try:
        os.set_blocking(info_fd, False)
        pid = json.loads(os.read(info_fd, 65536)).get("child-pid")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(pid, int) and pid > 0:
        orphans.pin(pid, lambda p: is_nested_init(p, (monitor, os.getpid())))


class Orphans:
    """Pidfds of a run's processes, to be waited for once they are the trainer's children."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pidfd -> pid (for messages)

    def pin(self, pid: int, belongs: Callable[[int], bool]) -> int | None:
        """Hold ``pid`` when ``belongs(pid)`` is still true once its pidfd is open; the pidfd, or None."""
        if pid == os.getpid():
            return None
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            return None
        if not belongs(pid):
            os.close(fd)
            return None
        self._fds[fd] = pid
        return fd

    def __len__(self) -> int:
        return len(self._fds)

    def reap(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for every pinned process to end, and reap those that are this
        process's children. What is neither reaped nor gone by then stays pinned for the next call."""
        deadline = time.monotonic() + timeout
        while self._fds:
            for fd in list(self._fds):
                if self._settled(fd):
                    os.close(fd)
                    del self._fds[fd]
            left = deadline - time.monotonic()
            if not self._fds or left <= 0:
                return
            poller = select.poll()
            for fd in self._fds:
                poller.register(fd, select.POLLIN)
            if poller.poll(min(left, 0.05) * 1000):  # a pidfd is readable once its process has exited, and
                time.sleep(0.002)  # stays so while it waits as a zombie for its own (dying) parent

    @staticmethod
    def _settled(fd: int) -> bool:
        """Reaped now, or gone (reaped by its own parent): nothing left to wait for."""
        try:
            return os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG) is not None
        except ChildProcessError:  # not (yet) the trainer's child: gone, or its parent will give it to us
            pass
        try:
            signal.pidfd_send_signal(fd, 0)
        except ProcessLookupError:
            return True
        return False

    def take(self, other: Orphans) -> None:
        """Hold ``other``'s pinned processes from now on."""
        self._fds.update(other._fds)
        other._fds.clear()

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


_leftovers = Orphans()
_leftovers_lock = threading.Lock()


def reap_run(orphans: Orphans, timeout: float) -> None:
    """Reap a finished run's pinned processes (waiting at most ``timeout`` seconds for them to end), then what
    earlier runs left unsettled; what is still not settled is tried again after a later run."""
    orphans.reap(timeout)
    with _leftovers_lock:
        _leftovers.take(orphans)
        _leftovers.reap(0)
