"""A control group per run: memory and task limits the kernel counts, and a way to kill everything in it.

The memory limit counts what ``RLIMIT_AS`` does not: tmpfs pages (the run's folder, ``/tmp``, ``/dev/shm``),
page cache and kernel memory; swap is included where the kernel accounts it. The task limit counts every
process and thread of the run, whatever its uid. The run's launcher joins the group before it starts
anything (``echo $$ > cgroup.procs``), so everything the run starts is in it.

cgroup v2 (one ``cgroup2`` mount with the ``memory`` and ``pids`` controllers delegated to the trainer's own
group) and v1 (separate ``memory`` and ``pids`` hierarchies, as this project's CI machine has) are both
handled; the run's groups are made under the trainer's own, so any limit placed on the trainer holds too.
:func:`cgroup_missing` says why neither can be used (typically: not root, and no delegated v2 subtree); the
sandbox then refuses to run unless weak isolation was accepted (see :class:`PythonSandbox`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunCgroup", "cgroup_missing", "cgroup_version"]

ROOT = Path("/sys/fs/cgroup")
GROUP = "lit-agentrl-sandbox"
"""The folder, under the trainer's own group in each hierarchy, that holds one group per run."""


def _own_groups() -> dict[str, str]:
    return _parse("/proc/self/cgroup")


def _parse(proc_cgroup: str) -> dict[str, str]:
    """A process's group per hierarchy: ``{"memory": "/a/b", "pids": "/", "": "/..." (v2)}``."""
    groups: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(proc_cgroup).read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                groups[controller] = path
    return groups


def _v1_dir(controller: str, groups: dict[str, str]) -> Path | None:
    mount = ROOT / controller
    if controller not in groups or not (mount / "cgroup.procs").exists():
        return None
    own = mount / groups[controller].lstrip("/")
    return own if own.is_dir() else mount  # a cgroup namespace shows its own group as the mount's root


def _v2_dir(groups: dict[str, str]) -> Path | None:
    mount = ROOT if (ROOT / "cgroup.controllers").exists() else ROOT / "unified"
    if "" not in groups or not (mount / "cgroup.controllers").exists():
        return None
    own = mount / groups[""].lstrip("/")
    return own if own.is_dir() else mount


def _parents() -> tuple[str, list[Path]] | None:
    """Where runs' groups go: ("v1", [memory dir, pids dir]) or ("v2", [dir]), or None."""
    groups = _own_groups()
    memory, pids = _v1_dir("memory", groups), _v1_dir("pids", groups)
    if memory is not None and pids is not None:
        return "v1", [memory / GROUP, pids / GROUP]
    v2 = _v2_dir(groups)
    if v2 is not None and {"memory", "pids"} <= set((v2 / "cgroup.controllers").read_text().split()):
        return "v2", [v2 / GROUP]
    return None


def _prepare_parents() -> tuple[str, list[Path]]:
    """The parents, made and (v2) with the controllers handed down; OSError when that is not allowed."""
    found = _parents()
    if found is None:
        raise OSError("no cgroup hierarchy with the memory and pids controllers is mounted")
    version, dirs = found
    for directory in dirs:
        if version == "v2":  # the trainer's group hands the controllers down (refused while it holds processes)
            _enable_controllers(directory.parent)
        directory.mkdir(exist_ok=True)
        if version == "v2":
            _enable_controllers(directory)
    return version, dirs


def _enable_controllers(directory: Path) -> None:
    control = directory / "cgroup.subtree_control"
    if not {"memory", "pids"} <= set(control.read_text().split()):
        try:
            control.write_text("+memory +pids")
        except OSError as exc:
            raise OSError(
                f"{control}: cannot hand the memory and pids controllers down ({exc}); cgroup v2 lets a group do "
                "that only when it holds no process itself: start the trainer in a leaf of a delegated subtree"
            ) from exc


def cgroup_version() -> str | None:
    """``"v1"`` or ``"v2"``: what :class:`RunCgroup` will use here; None when :func:`cgroup_missing`."""
    found = _parents()
    return None if found is None or cgroup_missing() else found[0]


_checked: list[str | None] = []


def cgroup_missing() -> str | None:
    """Why per-run groups cannot be made here (checked once, by making one), or None."""
    if not _checked:
        try:
            group = RunCgroup.create(memory_bytes=64 * 2**20, tasks=4)
            group.remove()
            _checked.append(None)
        except OSError as exc:
            _checked.append(
                f"cannot make a cgroup per run ({exc}); run the trainer as root, or in a delegated "
                "cgroup v2 subtree with the memory and pids controllers"
            )
    return _checked[0]


@dataclass
class RunCgroup:
    """One run's group(s): made with its limits, joined by the run's launcher, emptied and removed after."""

    version: str
    dirs: list[Path]

    @classmethod
    def create(cls, memory_bytes: int, tasks: int) -> RunCgroup:
        version, parents = _prepare_parents()
        name = f"run-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        group = cls(version, [parent / name for parent in parents])
        try:
            for directory in group.dirs:
                directory.mkdir()
            if version == "v1":
                memory, pids = group.dirs
                (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                swap = memory / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    swap.write_text(str(memory_bytes))
                (pids / "pids.max").write_text(str(tasks))
            else:
                (directory,) = group.dirs
                (directory / "memory.max").write_text(str(memory_bytes))
                swap = directory / "memory.swap.max"
                if swap.exists():
                    swap.write_text("0")
                (directory / "pids.max").write_text(str(tasks))
        except OSError:
            group.remove()
            raise
        return group

    @property
    def procs_files(self) -> list[str]:
        """The files the launcher writes its pid into, to join."""
        return [str(directory / "cgroup.procs") for directory in self.dirs]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                found |= {int(pid) for pid in Path(path).read_text().split()}
        return sorted(found)

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is in this group now (its ``/proc/PID/cgroup`` names it; a zombie has left it)."""
        try:
            groups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        return any(f"/{GROUP}/{directory.name}\n" in groups for directory in self.dirs)

    def out_of_memory(self) -> bool:
        """Whether the kernel refused the run memory at its limit (v1: a failed charge; v2: an OOM kill)."""
        try:
            if self.version == "v1":
                return int((self.dirs[0] / "memory.failcnt").read_text()) > 0
            events = dict(line.split() for line in (self.dirs[0] / "memory.events").read_text().splitlines())
            return int(events.get("oom_kill", "0")) > 0
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL everything in the group (v2: ``cgroup.kill``; v1: each pid, until none is left)."""
        kill_file = self.dirs[0] / "cgroup.kill"
        if self.version == "v2" and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
            return
        for _ in range(100):  # a fork between reading and killing is caught by the next round
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def remove(self) -> None:
        """Kill what is left and remove the group(s); never raises (a group that stays is retried by rmdir)."""
        self.kill()
        for directory in self.dirs:
            for _ in range(200):  # the kernel frees a group shortly after its last task is reaped
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)
