"""The parent's side of a sandboxed run: :class:`PythonSandbox`.

It finds out once which isolation this machine allows (a probe run), prepares each run (a private folder
with the code in ``main.py``, a uid, a task limit, the child's config), launches the child, keeps a bounded
part of its output, kills it at the wall-clock limit, and turns what happened into a :class:`SandboxResult`.

The child's code is the text of :mod:`~lit_agentrl.tools.sandbox.stage1`,
:mod:`~lit_agentrl.tools.sandbox.rootfs`, :mod:`~lit_agentrl.tools.sandbox.stage2` and
:mod:`~lit_agentrl.tools.sandbox.guard`, read from those files once and passed on the command line:
``python -I -S -B -c LAUNCH STAGE1 CONFIG ROOTFS STAGE2 GUARD``. Stage 1 runs ROOTFS in a namespace of its own
and ``exec``s ``python -I -S -B -c LAUNCH STAGE2 CONFIG GUARD``; stage 2 compiles GUARD into a namespace of
its own. The child never imports the project.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lit_agentrl.tools.sandbox.limits import SandboxLimits
from lit_agentrl.tools.sandbox.processes import (
    UID_SPAN,
    kill_by_token,
    kill_group,
    next_run_number,
    remove_tree,
    uid_base,
    user_task_count,
)
from lit_agentrl.tools.sandbox.results import OutputCapture, SandboxResult, failure, result_from_exit
from lit_agentrl.tools.sandbox.stage2 import MARKER

__all__ = [
    "CHILD_ENV",
    "GUARD_SOURCE",
    "HOOK_ONLY",
    "LAUNCH",
    "ROOTFS_SOURCE",
    "STAGE1_SOURCE",
    "STAGE2_SOURCE",
    "TOKEN_PREFIX",
    "PythonSandbox",
]

LAUNCH = "import sys;exec(compile(sys.argv[1],'" + MARKER + "','exec'))"
"""The child's ``-c`` program: run ``sys.argv[1]`` (a stage's text) as ``__main__``, under the marker name."""
TOKEN_PREFIX = "lit-agentrl-run-"
"""A run's token, in its child's command line (and its children's), is ``TOKEN_PREFIX<trainer pid>-<n>-<random>``."""
STAGE1_SOURCE = Path(__file__).with_name("stage1.py").read_text(encoding="utf-8")
STAGE2_SOURCE = Path(__file__).with_name("stage2.py").read_text(encoding="utf-8")
ROOTFS_SOURCE = Path(__file__).with_name("rootfs.py").read_text(encoding="utf-8")
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

HOOK_ONLY = "audit hook only"
"""``isolation["filesystem"]`` where the kernel offers no file-system layer: only the audit hook guards files."""
MOUNT_NAMESPACE = "mount namespace"

_probe_cache: dict[tuple[str, bool, bool, bool], dict[str, Any]] = {}
_probe_lock = threading.Lock()


class PythonSandbox:
    """Runs Python code in a separate, limited, isolated process (docs/sandbox.md says what
    that protects against, and what not).

    Args:
        limits: resource limits of each run.
        python: the interpreter to run the code with (its standard library is readable to the code).
        site_packages: let the code import the interpreter's ``site-packages`` (numpy, sympy, ...); they
            become readable. ``.pth`` files are not processed, so editable installs (this project) stay out.
        drop_privileges: when the trainer runs as root, run the code as a per-run unprivileged uid.
        isolate_filesystem: run the code in a minimal root of its own (mount and PID namespaces), where the
            kernel allows it (root, or unprivileged user namespaces). False: do not try, so the audit hook
            alone guards the file system (for machines where the namespaces misbehave, and for tests).

    ``await sandbox.arun(code)`` never blocks the event loop; ``sandbox.run(code)`` blocks. Both return a
    :class:`SandboxResult` and never raise for problems of the code.
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),  # noqa: B008 (frozen: sharing it is safe)
        python: str = sys.executable,
        *,
        site_packages: bool = False,
        drop_privileges: bool = True,
        isolate_filesystem: bool = True,
    ) -> None:
        if not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
        if not python:
            raise ValueError("PythonSandbox needs a Python interpreter (sys.executable is empty)")
        self.limits = limits
        self.python = python
        self.site_packages = site_packages
        self.drop_privileges = drop_privileges
        self.isolate_filesystem = isolate_filesystem
        self._guard = True  # tests switch the audit hook off to check the kernel-enforced layers alone

    def __repr__(self) -> str:
        return f"PythonSandbox(limits={self.limits!r}, python={self.python!r}, site_packages={self.site_packages})"

    # ---------------------------------------------------------------- isolation actually available here

    @property
    def isolation(self) -> dict[str, Any]:
        """What this machine allows, found once per interpreter by a probe run: ``filesystem`` (``"mount
        namespace"``: the code sees only its own minimal root; ``"audit hook only"``: no kernel-enforced
        file-system boundary), ``netns`` (network namespace), ``dropped`` (root: runs as an unprivileged uid),
        ``keep_read`` (that uid keeps CAP_DAC_READ_SEARCH because the Python installation isn't readable by
        others), ``uid``."""
        want_drop = self.drop_privileges and os.geteuid() == 0
        key = (self.python, self.site_packages, want_drop, self.isolate_filesystem)
        with _probe_lock:
            if key not in _probe_cache:
                _probe_cache[key] = self._best_probe(want_drop)
            return dict(_probe_cache[key])

    def _best_probe(self, want_drop: bool) -> dict[str, Any]:
        """The first setup that starts here, strongest first."""
        setups = [(want_drop, True), (want_drop, False), (False, True), (False, False)]
        for fs in (True, False) if self.isolate_filesystem else (False,):
            for drop, netns in dict.fromkeys(setups):
                report = self._probe(drop=drop, netns=netns, fs=fs)
                if report is not None:
                    fs_ok = report.pop("fs", False)
                    return {**report, "filesystem": MOUNT_NAMESPACE if fs_ok else HOOK_ONLY}
        return {"filesystem": HOOK_ONLY, "netns": False, "dropped": False, "keep_read": False, "uid": None}

    @property
    def network_isolated(self) -> bool:
        """True when runs get their own network namespace (kernel-enforced: no network at all). Either way
        the audit hook refuses sockets, which determined code could bypass (see docs/sandbox.md)."""
        return bool(self.isolation["netns"])

    @property
    def filesystem_isolated(self) -> bool:
        """True when runs see only their own minimal root (kernel-enforced); False: the audit hook alone
        keeps the code from the machine's files, which determined code can get past (see docs/sandbox.md). Code
        running as root (no privilege drop) keeps the capabilities to mount its way out: False then too."""
        iso = self.isolation
        return iso["filesystem"] == MOUNT_NAMESPACE and (bool(iso["dropped"]) or os.geteuid() != 0)

    @property
    def privileges_dropped(self) -> bool:
        """True when (as root) the code runs as an unprivileged uid: kernel-enforced NPROC, kill, write limits."""
        return bool(self.isolation["dropped"])

    def _probe(self, drop: bool, netns: bool, fs: bool) -> dict[str, Any] | None:
        """Start a child that only reports what it got; None when that setup can't start here."""
        tmp, argv, env, token = self._prepare("", drop=drop, netns=netns, fs=fs, probe=True)
        try:
            done = subprocess.run(
                argv,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
                start_new_session=True,
                close_fds=True,
            )
            if done.returncode != 0:
                return None
            report: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
            return report
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None
        finally:
            kill_by_token(token)
            remove_tree(tmp)

    # ---------------------------------------------------------------------------------------- preparing

    def _run_uid(self, drop: bool) -> int | None:
        """The run's own unprivileged uid (root only, when dropping privileges and a uid block is mapped)."""
        if not (drop and os.geteuid() == 0):
            return None
        base = uid_base()
        return None if base is None else base + next_run_number() % UID_SPAN

    def _task_limit(self, uid: int | None, fs: bool) -> int | None:
        """``RLIMIT_NPROC`` for the run: the kernel counts every task of the uid, and ignores it for root."""
        if uid is not None:
            return 1 + self.limits.max_processes
        if os.geteuid() == 0:
            return None
        if self.limits.max_processes == 0:
            return 1  # counts every task of the user, so the child can't create any
        # With the file-system layer, the run's outer process and its PID 1 are the user's tasks too.
        return user_task_count(os.getuid()) + self.limits.max_processes + (2 if fs else 0)

    @staticmethod
    def _make_run_dir(code: str, uid: int | None) -> str:
        """A fresh folder holding ``main.py``, owned by the run's uid when there is one."""
        tmp = os.path.realpath(tempfile.mkdtemp(prefix="lit-agentrl-sandbox-"))
        try:
            path = os.path.join(tmp, "main.py")
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(code)
            if uid is not None:
                os.chown(tmp, uid, uid)
                os.chown(path, uid, uid)
        except BaseException:
            remove_tree(tmp)
            raise
        return tmp

    def _prepare(
        self, code: str, drop: bool, netns: bool, fs: bool, probe: bool = False
    ) -> tuple[str, list[str], dict[str, str], str]:
        """The run's directory (with main.py), argv, environment and command-line token."""
        limits = self.limits
        uid = self._run_uid(drop)
        nproc = self._task_limit(uid, fs)
        tmp = self._make_run_dir(code, uid)
        token = f"{TOKEN_PREFIX}{os.getpid()}-{next_run_number()}-{random.getrandbits(48):012x}"
        cfg = {
            "token": token,
            "dir": tmp,
            "cpu": max(1, math.ceil(limits.cpu_seconds)),
            "memory": int(limits.memory_mb) * 2**20,
            "fsize": int(limits.file_size_mb) * 2**20,
            "nproc": nproc,
            "uid": uid,
            "netns": netns,
            "fs": fs,
            "site": self.site_packages,
            "allow_fork": limits.max_processes > 0,
            "guard": self._guard,
            "probe": probe,
            "ppid": os.getpid(),
            "launch": LAUNCH,
        }
        stages = [STAGE1_SOURCE, json.dumps(cfg), ROOTFS_SOURCE, STAGE2_SOURCE, GUARD_SOURCE]
        argv = [self.python, "-I", "-S", "-B", "-c", LAUNCH, *stages]
        env = dict(CHILD_ENV, HOME=tmp, TMPDIR=tmp)
        return tmp, argv, env, token

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
            iso = await asyncio.to_thread(lambda: self.isolation)
            fs = iso["filesystem"] == MOUNT_NAMESPACE
            tmp, argv, env, token = await asyncio.to_thread(self._prepare, code, iso["dropped"], iso["netns"], fs)
        except Exception as exc:  # the machine, not the code: still an answer, not an exception
            return failure(f"SandboxError: could not prepare the run: {type(exc).__name__}: {exc}")
        result = await self._launch(argv, tmp, env, token)
        await asyncio.to_thread(remove_tree, tmp)
        return result

    async def _launch(self, argv: list[str], tmp: str, env: dict[str, str], token: str) -> SandboxResult:
        """Start the child, keep its output, kill it at the wall-clock limit (or when cancelled: then its
        folder is removed here and the cancellation goes on)."""
        limits = self.limits
        out, err = OutputCapture(limits.output_bytes), OutputCapture(limits.output_bytes, tail=True)
        proc: asyncio.subprocess.Process | None = None
        pumps: asyncio.Future[Any] | None = None
        timed_out = False
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=tmp,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
            pumps = asyncio.gather(_pump(proc.stdout, out), _pump(proc.stderr, err))
            try:
                await asyncio.wait_for(proc.wait(), timeout=limits.wall_seconds)
            except TimeoutError:
                timed_out = True
                kill_group(proc.pid)
                await proc.wait()
            if limits.max_processes > 0:  # children may outlive the run, in its group or not
                kill_group(proc.pid)
                kill_by_token(token)
            try:
                await asyncio.wait_for(pumps, timeout=2.0)
            except TimeoutError:  # a leftover still holds the pipes
                _discard(pumps)
            return result_from_exit(proc.returncode, timed_out, out, err, limits)
        except asyncio.CancelledError:
            if proc is not None and proc.returncode is None:
                kill_group(proc.pid)
            if pumps is not None:
                _discard(pumps)
            kill_by_token(token)
            remove_tree(tmp)
            raise
        except Exception as exc:
            if proc is not None and proc.returncode is None:
                kill_group(proc.pid)
            if pumps is not None:
                _discard(pumps)
            return failure(f"SandboxError: {type(exc).__name__}: {exc}")
        finally:
            _close_transport(proc)


def _discard(future: asyncio.Future[Any]) -> None:
    """Cancel the pipe readers without leaving an unretrieved exception behind."""
    future.cancel()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


def _close_transport(proc: asyncio.subprocess.Process | None) -> None:
    """Close the child's pipes now (asyncio keeps them open while unread output is buffered)."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()


async def _pump(stream: asyncio.StreamReader | None, capture: OutputCapture) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        capture.add(chunk)
