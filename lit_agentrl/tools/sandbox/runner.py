"""The parent's side of a sandboxed run: :class:`PythonSandbox`.

It finds out once what this machine allows (:attr:`PythonSandbox.isolation`, from a probe run) and refuses to
be built without the whole boundary unless weak isolation is accepted. Each run gets a cgroup
(:mod:`.cgroups`), a seccomp filter (:mod:`.syscalls`) and bubblewrap's namespaces and mounts
(:mod:`.boundary`); the parent keeps a bounded part of the child's output, kills it at the wall-clock limit
or when its output floods, and turns what happened into a :class:`SandboxResult`.

The child runs ``python -I -S -B -c LAUNCH STAGE CONFIG GUARD``: :mod:`.stage` and :mod:`.guard` travel as
text (the child never imports the project).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_agentrl.tools.sandbox.boundary import RUN_DIR, Boundary, boundary_missing, interpreter_layout, reachable_by
from lit_agentrl.tools.sandbox.cgroups import RunCgroup, cgroup_missing, cgroup_version
from lit_agentrl.tools.sandbox.limits import SandboxLimits
from lit_agentrl.tools.sandbox.processes import (
    UID_SPAN,
    kill_by_token,
    kill_group,
    next_run_number,
    own_uid_base,
    remove_tree,
)
from lit_agentrl.tools.sandbox.reaping import Orphans, become_subreaper, pin_bwrap_init, reap_run
from lit_agentrl.tools.sandbox.results import (
    FLOOD_FACTOR,
    OutputCapture,
    SandboxResult,
    failure,
    result_from_exit,
    tail,
)
from lit_agentrl.tools.sandbox.stage import MARKER
from lit_agentrl.tools.sandbox.syscalls import boundary_filter, exec_filter, seccomp_missing
from lit_agentrl.tools.sandbox.verdict import Verdict, outcome, read_verdict

__all__ = ["CHILD_ENV", "GUARD_SOURCE", "LAUNCH", "STAGE_SOURCE", "TOKEN_PREFIX", "PythonSandbox", "SandboxUnavailable"]

LAUNCH = "import sys;exec(compile(sys.argv[1],'" + MARKER + "','exec'))"
"""The child's ``-c`` program: run ``sys.argv[1]`` (the stage's text) as ``__main__``, under the marker name."""
TOKEN_PREFIX = "lit-agentrl-run-"
"""A run's token, in its child's command line, is ``TOKEN_PREFIX<trainer pid>-<n>-<random>``."""
STAGE_SOURCE = Path(__file__).with_name("stage.py").read_text(encoding="utf-8")
GUARD_SOURCE = Path(__file__).with_name("guard.py").read_text(encoding="utf-8")

CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The child's whole environment (plus ``HOME`` and ``TMPDIR``: its folder); nothing of the trainer's."""
KILL_GRACE_SECONDS = 30.0
"""How long the parent waits for a killed run to be reaped (and its pipes to close) before giving up on it."""
BWRAP_TASKS = 2
"""Tasks of a run besides the code's own: bubblewrap's monitor outside and the run's supervisor (PID 1) inside."""

_probe_cache: dict[tuple[str, bool], dict[str, Any]] = {}
_probe_lock = threading.Lock()


class SandboxUnavailable(RuntimeError):
    """The kernel boundary cannot be built here and weak isolation was not accepted."""


@dataclass
class _Run:
    """One prepared run: what to start, and what to undo afterwards."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    token: str
    fds: list[int] = field(default_factory=list)
    """Descriptors the child inherits (closed here once it has started)."""
    cgroup: RunCgroup | None = None
    host_dir: str | None = None
    bwrap: bool = False
    verdict: int | None = None
    """The read end of the verdict pipe (:mod:`.verdict`)."""
    info: int | None = None
    """The read end of bubblewrap's ``--info-fd``, which names the run's PID 1 (its supervisor)."""
    monitor: int | None = None
    """The pid of the run's launcher, which becomes bubblewrap's monitor: the trainer's own child."""
    orphans: Orphans = field(default_factory=Orphans)
    """The run's processes that may be left to the trainer to reap."""

    def release(self) -> None:
        """Close its descriptors, reap what it left to the trainer, remove its cgroup and its host folder (weak
        mode); never raises."""
        if self.info is not None and self.monitor is not None:  # bubblewrap's PID 1, if the trainer must reap it
            pin_bwrap_init(self.orphans, self.info, self.monitor)
        for fd in [*self.fds, self.verdict, self.info]:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fds.clear()
        self.verdict = self.info = None
        reap_run(self.orphans, KILL_GRACE_SECONDS)
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.host_dir is not None:
            remove_tree(self.host_dir)


class PythonSandbox:
    """Runs Python code in a separate, limited, isolated process (docs/sandbox.md says what that protects
    against, and what not).

    Args:
        limits: resource limits of each run.
        python: the interpreter to run the code with (its standard library is readable to the code).
        site_packages: let the code import the interpreter's ``site-packages`` (numpy, sympy, ...); they
            become readable. ``.pth`` files are not processed, so editable installs (this project) stay out.
        allow_weak_sandbox: run even where the boundary cannot be built (no bubblewrap, no user namespaces,
            no cgroups, no libseccomp), with whatever of it this machine allows; ``isolation["missing"]``
            says what is not there. False (the default): raise :class:`SandboxUnavailable` here, naming it.

    ``await sandbox.arun(code)`` never blocks the event loop; ``sandbox.run(code)`` blocks. Both return a
    :class:`SandboxResult` and never raise for problems of the code.
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),  # noqa: B008 (frozen: sharing it is safe)
        python: str = sys.executable,
        *,
        site_packages: bool = False,
        allow_weak_sandbox: bool = False,
    ) -> None:
        if not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
        if not python:
            raise ValueError("PythonSandbox needs a Python interpreter (sys.executable is empty)")
        if not os.access(python, os.X_OK):
            raise ValueError(f"PythonSandbox: python={python!r} is not an executable file")
        self.limits = limits
        self.python = python
        self.site_packages = site_packages
        self.allow_weak_sandbox = allow_weak_sandbox
        self._guard = True  # tests switch the audit hook off to check the kernel-enforced layers alone
        become_subreaper()  # what a run leaves behind is the trainer's to reap, even as PID 1 (.reaping)
        missing = self.isolation["missing"]
        if missing and not allow_weak_sandbox:
            raise SandboxUnavailable(
                "PythonSandbox: the kernel boundary cannot be built on this machine: " + "; ".join(missing) + ". "
                "Install what is named (docs/sandbox.md: what the machine needs), pass allow_weak_sandbox=True "
                "(agent YAML: allow_weak_sandbox: true) to run with what there is, or use a remote code runner."
            )

    def __repr__(self) -> str:
        return f"PythonSandbox(limits={self.limits!r}, python={self.python!r}, site_packages={self.site_packages})"

    # ---------------------------------------------------------------- isolation actually available here

    @property
    def isolation(self) -> dict[str, Any]:
        """What this machine allows, found once per interpreter: ``boundary`` (``"bubblewrap"`` or None),
        ``seccomp`` (bool), ``cgroup`` (``"v1"``, ``"v2"`` or None), ``uid_drop`` (as root: each run has
        a uid of its own), ``missing`` (what keeps the boundary from being whole, each with its fix)."""
        key = (self.python, self.site_packages)
        with _probe_lock:
            if key not in _probe_cache:
                _probe_cache[key] = self._probe_machine()
            return dict(_probe_cache[key])

    @property
    def strong(self) -> bool:
        """True when every run gets the whole boundary (nothing is ``missing``)."""
        return not self.isolation["missing"]

    def _probe_machine(self) -> dict[str, Any]:
        missing: list[str] = []
        seccomp_reason, cgroup_reason = seccomp_missing(), cgroup_missing()
        missing += [reason for reason in (seccomp_reason, cgroup_reason) if reason]
        root = os.geteuid() == 0
        report: dict[str, Any] = {
            "boundary": None,
            "seccomp": seccomp_reason is None,
            "cgroup": None if cgroup_reason else cgroup_version(),
            "uid_drop": root and own_uid_base() is not None,
        }
        if root and own_uid_base() is None:
            missing.append("no range of unused uids to run the code as (the uid map is too small)")
        reason = boundary_missing() or self._probe_run(report)
        if reason:
            missing.append(reason)
        else:
            report["boundary"] = "bubblewrap"
        if report["uid_drop"] and reason and not self._reachable_by_others():
            report["uid_drop"] = False  # weak mode: a plain child as another uid could not start this interpreter
            missing.append(f"{self.python}'s folders are not readable by other users, so weak runs stay root")
        return {**report, "missing": missing}

    def _reachable_by_others(self) -> bool:
        mounts = interpreter_layout(self.python, self.site_packages)
        base = own_uid_base()
        return base is not None and all(reachable_by(base, path) for path in mounts.binds)

    def _probe_run(self, report: dict[str, Any]) -> str | None:
        """Start one run through bubblewrap that only reports itself; why it failed, or None."""
        try:
            run = self._prepare("", {**report, "boundary": "bubblewrap"}, probe=True)
        except Exception as exc:
            return f"bubblewrap could not be prepared here ({type(exc).__name__}: {exc})"
        try:
            done = subprocess.run(
                run.argv,
                cwd=run.cwd,
                env=run.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=60,
                start_new_session=True,
                pass_fds=run.fds,
            )
            started = run.verdict is not None and read_verdict(run.verdict).started
            answer = json.loads(done.stdout.decode().strip().splitlines()[-1]) if started else None
            if answer is None or answer.get("cwd") != RUN_DIR:
                stderr = done.stderr.decode(errors="replace").strip()[-600:]
                return f"bubblewrap could not start a run here (exit {done.returncode}: {stderr or 'no message'})"
        except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
            return f"bubblewrap could not start a run here ({type(exc).__name__}: {exc})"
        finally:
            run.release()
        return None

    # ---------------------------------------------------------------------------------------- preparing

    def _run_uid(self, report: dict[str, Any]) -> int | None:
        """The run's own unprivileged uid (root with a usable uid range), else None."""
        base = own_uid_base() if report["uid_drop"] else None
        return None if base is None else base + next_run_number() % UID_SPAN

    def _tasks(self, bwrap: bool) -> int:
        """Every task a run may have: the interpreter, ``max_processes`` more, and bubblewrap's monitor and PID 1
        (without bubblewrap the launcher has become the interpreter). The run's cgroup counts them all."""
        return 1 + self.limits.max_processes + (BWRAP_TASKS if bwrap else 0)

    def _task_limit(self, uid: int | None, bwrap: bool) -> int | None:
        """``RLIMIT_NPROC``, which counts every task of the uid: only meaningful for a uid of the run's own."""
        return None if uid is None else self._tasks(bwrap)

    def _prepare(self, code: str, report: dict[str, Any], probe: bool = False) -> _Run:
        """Everything a run needs, made; on failure, what was made is undone."""
        limits = self.limits
        bwrap = report["boundary"] == "bubblewrap"
        uid = self._run_uid(report)
        token = f"{TOKEN_PREFIX}{os.getpid()}-{next_run_number()}-{random.getrandbits(48):012x}"
        run = _Run(argv=[], cwd="/", env={}, token=token, bwrap=bwrap)
        memory = int(limits.memory_mb) * 2**20
        try:
            run.verdict, verdict_write = os.pipe()  # both ends close-on-exec; pass_fds hands the child its end
            run.fds.append(verdict_write)
            if report["cgroup"]:
                run.cgroup = RunCgroup.create(memory_bytes=memory, tasks=self._tasks(bwrap))
            folder = RUN_DIR if bwrap else self._host_folder(code, uid, run)
            filters = [exec_filter()] if bwrap else [boundary_filter(), exec_filter()] if report["seccomp"] else []
            cfg = {
                "token": token,
                "dir": folder,
                "cpu": max(1, math.ceil(limits.cpu_seconds)),
                "memory": memory,
                "fsize": int(limits.file_size_mb) * 2**20,
                "nproc": self._task_limit(uid, bwrap),
                "site": self.site_packages,
                "allow_fork": limits.max_processes > 0,
                "guard": self._guard,
                "probe": probe,
                "filters": [program.hex() for program in filters],
                "verdict_fd": verdict_write,
                "supervise": bwrap,
            }
            command = [self.python, "-I", "-S", "-B", "-c", LAUNCH, STAGE_SOURCE, json.dumps(cfg), GUARD_SOURCE]
            env = dict(CHILD_ENV, HOME=folder, TMPDIR=folder)
            if bwrap:
                run.argv = self._bwrap_argv(command, code, uid, env, run)
                run.env = {"PATH": CHILD_ENV["PATH"]}  # the launcher's own; bwrap clears it for the code
            else:
                run.argv, run.env, run.cwd = _joined(run.cgroup, _as_user(uid, command)), env, folder
        except BaseException:
            run.release()
            raise
        return run

    def _bwrap_argv(self, command: list[str], code: str, uid: int | None, env: dict[str, str], run: _Run) -> list[str]:
        code_fd = _memfd("main.py", code.encode("utf-8", "surrogatepass"))
        seccomp_fd = _memfd("seccomp", boundary_filter())
        run.info, info_write = os.pipe()
        run.fds += [code_fd, seccomp_fd, info_write]
        boundary = Boundary(
            mounts=interpreter_layout(self.python, self.site_packages),
            uid=uid,
            scratch_bytes=int(self.limits.file_size_mb) * 2**20 * 4,
            cgroup_procs=tuple(run.cgroup.procs_files) if run.cgroup else (),
            env=env,
            code_fd=code_fd,
            seccomp_fd=seccomp_fd,
            info_fd=info_write,
        )
        return boundary.argv([*command, run.token])

    def _host_folder(self, code: str, uid: int | None, run: _Run) -> str:
        """Weak mode's run folder on the host (no tmpfs of its own), owned by the run's uid."""
        folder = os.path.realpath(tempfile.mkdtemp(prefix="lit-agentrl-sandbox-"))
        run.host_dir = folder
        path = os.path.join(folder, "main.py")
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(code)
        if uid is not None:
            os.chown(folder, uid, uid)
            os.chown(path, uid, uid)
        return folder

    # ---------------------------------------------------------------------------------------- running

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` and wait for it (blocking). Inside a running event loop, prefer :meth:`arun`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(code))
        with ThreadPoolExecutor(max_workers=1) as pool:  # called from a coroutine: run on a loop of its own
            return pool.submit(asyncio.run, self.arun(code)).result()

    async def arun(self, code: str) -> SandboxResult:
        """Run ``code`` in a fresh sandboxed process without blocking the event loop."""
        if not isinstance(code, str):
            return failure(f"TypeError: the code must be a string, got {type(code).__name__}")
        try:
            report = await asyncio.to_thread(lambda: self.isolation)
            run = await asyncio.to_thread(self._prepare, code, report)
        except Exception as exc:  # the machine, not the code: still an answer, not an exception
            return failure(f"SandboxError: could not prepare the run: {type(exc).__name__}: {exc}")
        try:
            return await self._launch(run)
        finally:
            await asyncio.shield(asyncio.to_thread(run.release))

    async def _launch(self, run: _Run) -> SandboxResult:
        """Start the child, keep its output, kill it at the wall-clock limit, on an output flood, or when
        cancelled (then the cancellation goes on)."""
        limits = self.limits
        out, err = OutputCapture(limits.output_bytes), OutputCapture(limits.output_bytes, tail=True)
        flood = asyncio.Event()
        proc: asyncio.subprocess.Process | None = None
        waiting: list[asyncio.Future[Any]] = []
        try:
            proc = await self._start(run)
            cap = FLOOD_FACTOR * limits.output_bytes
            pumps = asyncio.gather(_pump(proc.stdout, out, err, cap, flood), _pump(proc.stderr, err, out, cap, flood))
            ended, flooded = asyncio.ensure_future(proc.wait()), asyncio.ensure_future(flood.wait())
            waiting += [pumps, ended, flooded]
            done, _ = await asyncio.wait({ended, flooded}, timeout=limits.wall_seconds, return_when="FIRST_COMPLETED")
            timed_out = ended not in done and not flood.is_set()
            self._kill(proc.pid, run)  # all of it, or whatever the code left running
            try:
                await asyncio.wait_for(ended, timeout=KILL_GRACE_SECONDS)
            except TimeoutError:  # never expected: a parent that waits forever is worse than a lost answer
                return failure(f"SandboxError: the run did not end {KILL_GRACE_SECONDS:g} s after it was killed")
            with contextlib.suppress(TimeoutError):  # a leftover still holding the pipes: its output is lost
                await asyncio.wait_for(asyncio.shield(pumps), timeout=2.0)
            oom = run.cgroup is not None and run.cgroup.out_of_memory()
            killed = timed_out or flood.is_set() or oom
            verdict = Verdict(started=False) if run.verdict is None else read_verdict(run.verdict)
            code, broken = outcome(verdict, proc.returncode, bwrap=run.bwrap, killed=killed)
            if broken is not None:
                broken += f" (exit status {proc.returncode})" + (f":\n{tail(err.text())}" if err.data.strip() else "")
            return result_from_exit(
                code, timed_out, out, err, limits, flooded=flood.is_set(), out_of_memory=oom, sandbox_error=broken
            )
        except Exception as exc:
            return failure(f"SandboxError: {type(exc).__name__}: {exc}")
        finally:  # also when cancelled: the run is killed, and the cancellation goes on
            if proc is not None and proc.returncode is None:
                self._kill(proc.pid, run)
            for future in waiting:
                _discard(future)
            _close_transport(proc)

    @staticmethod
    async def _start(run: _Run) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            *run.argv,
            cwd=run.cwd,
            env=run.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=run.fds,
        )
        run.monitor = proc.pid
        for fd in run.fds:  # the child has its copies
            os.close(fd)
        run.fds.clear()
        return proc

    @staticmethod
    def _kill(pid: int, run: _Run) -> None:
        """Everything of the run: its cgroup, its process group (bubblewrap's children die with it), and in weak
        mode whatever carries its token. Without bubblewrap what the code forked is pinned first: it may be left
        to the trainer to reap (inside bubblewrap the run's PID 1 reaps it; PID 1 itself is pinned later)."""
        if run.cgroup is not None:
            if not run.bwrap:
                for member in run.cgroup.pids():
                    if member != pid:
                        run.orphans.pin(member, run.cgroup.holds)
            run.cgroup.kill()
        kill_group(pid)
        if not run.bwrap:
            kill_by_token(run.token, run.orphans)


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, read from its start by the child (never on disk)."""
    fd = os.memfd_create(f"lit-agentrl-{name}", 0)  # no MFD_CLOEXEC: passed on with pass_fds
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _as_user(uid: int | None, command: list[str]) -> list[str]:
    """Weak mode as root: the code as the run's uid, no groups, no capabilities (util-linux's setpriv)."""
    if uid is None:
        return command
    return ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "--inh-caps=-all", "--", *command]


def _joined(cgroup: RunCgroup | None, command: list[str]) -> list[str]:
    """``command`` started inside the run's cgroup (the shell joins it, then becomes the command)."""
    if cgroup is None:
        return command
    joins = "".join(f"echo $$ > {shlex.quote(path)}; " for path in cgroup.procs_files)
    return ["sh", "-c", f'set -e; {joins}exec "$@"', "sh", *command]


def _discard(future: asyncio.Future[Any]) -> None:
    """Cancel a pending reader or waiter without leaving an unretrieved exception behind."""
    if future.done():
        future.cancelled() or future.exception()  # retrieved, so asyncio does not log it
        return
    future.cancel()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


def _close_transport(proc: asyncio.subprocess.Process | None) -> None:
    """Close the child's pipes now (asyncio keeps them open while unread output is buffered)."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()


async def _pump(
    stream: asyncio.StreamReader | None, capture: OutputCapture, other: OutputCapture, cap: int, flood: asyncio.Event
) -> None:
    """Read ``stream`` in bounded chunks into ``capture``; set ``flood`` once both streams dropped ``cap`` bytes.
    It reads on to the end, which comes as soon as the run is killed: asyncio's ``wait()`` waits for the pipes."""
    if stream is None:
        return
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        capture.add(chunk)
        if capture.dropped + other.dropped > cap:
            flood.set()
