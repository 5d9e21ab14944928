"""The child's side of a sandboxed run: its limits, its last system-call filter, the audit hook, the code.

The child does not import this module: it runs ``python -I -S -B -c LAUNCH <this file's text> CONFIG <the
guard's text>`` (inside bubblewrap, see :mod:`.boundary`), where LAUNCH compiles ``sys.argv[1]`` under the
sandbox's marker file name and runs it as ``__main__``, which calls :func:`main`. Hence: the standard library
only, ASCII only (it travels in argv), and nothing done at import but definitions (the parent imports it for
its constants, and for tests).

Inside bubblewrap the interpreter starts as PID 1 of the run's PID namespace and first becomes the run's
supervisor (:func:`supervise`): it forks the process that runs the code, waits for it and writes its real
wait status (an exit status, or the signal that killed it) to the verdict descriptor. Before any model code
exists, :func:`main` (in that process) sets the resource limits, loads the seccomp filters it was given (always
the one that forbids starting programs; without bubblewrap also the main one), installs the audit hook (the
second layer, unless switched off), writes that its setup is done to the verdict descriptor and closes it,
and then runs the code from ``main.py``. The parent believes only the verdict descriptor (see :mod:`.verdict`):
nothing the code prints or exits with can pass for a setup failure or a signal.
"""

# ruff: noqa: SIM105  (no contextlib.suppress: it would be one more import in every run)

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False  # typing is not imported in the child: it would cost every run its import time
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any, NoReturn

MARKER = "<lit-agentrl-sandbox>"
"""The file name of the sandbox's own code in the child (hidden from tracebacks; found in its cmdline)."""
SETUP_EXIT = 113
"""Exit status of a setup failure (the parent does not read it: the verdict descriptor says what failed)."""
SETUP_PREFIX = "lit-agentrl-sandbox setup: "
"""Starts the message on stderr when even the verdict descriptor could not be written."""
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 38, 22, 2
VERDICT_FD = [-1]
"""The verdict descriptor (the write end of the parent's pipe), -1 once closed; set by :func:`main`."""


def tell(record: dict[str, Any]) -> None:
    """One line of JSON to the parent on the verdict descriptor (a few bytes: one atomic pipe write)."""
    os.write(VERDICT_FD[0], (json.dumps(record) + "\n").encode("ascii"))


def fail(message: str) -> NoReturn:
    """End the child with a setup failure, which the parent reports as ``SandboxError: message``."""
    try:
        tell({"setup": "failed", "error": message})
    except (OSError, ValueError):  # no verdict: the parent says the boundary did not start the run
        os.write(2, (SETUP_PREFIX + message + "\n").encode("utf-8", "replace"))
    os._exit(SETUP_EXIT)


def libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def set_dumpable(dumpable: bool) -> None:
    """``PR_SET_DUMPABLE``: a process that is not dumpable cannot be traced, nor its ``/proc/PID/mem`` and
    ``/proc/PID/fd`` opened, by others of its uid without ``CAP_SYS_PTRACE`` (none in the run has it)."""
    import ctypes

    ulong = ctypes.c_ulong
    if libc().prctl(PR_SET_DUMPABLE, ulong(int(dumpable)), ulong(0), ulong(0), ulong(0)) != 0:
        fail(f"could not set the dumpable flag: {os.strerror(ctypes.get_errno())}")


def supervise() -> None:
    """As PID 1 of the run's PID namespace: fork; the child returns (and goes on to run the code), this process
    waits for it, writes its real wait status to the verdict descriptor and ends, which ends the namespace.

    The code cannot reach this process: the kernel does not deliver to a namespace's PID 1 a signal sent from
    inside it unless PID 1 handles it (it handles none: SIGINT's handler is taken away), and a process that is
    not dumpable cannot be traced nor its memory or descriptors opened. bubblewrap reports a signal death as
    ``128 + N``, which an ``exit(128 + N)`` forges; this report cannot be."""
    import _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    set_dumpable(False)  # before the fork, so there is no moment when the code runs and this process is open
    code = os.fork()
    if code == 0:
        set_dumpable(True)  # the code's own process: as any other (its /proc/self stays its own)
        return
    while True:  # PID 1 also reaps whatever the code's forks leave to it
        pid, status = os.waitpid(-1, 0)
        if pid == code:
            break
    tell({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.waitstatus_to_exitcode(status)})
    os._exit(0)


def set_limits(cfg: dict[str, Any]) -> None:
    """CPU seconds (SIGKILL one second after SIGXCPU), address space, file size, tasks, no core, 256 files."""
    import resource

    limits = [("RLIMIT_CPU", cfg["cpu"], cfg["cpu"] + 1), ("RLIMIT_AS", cfg["memory"], cfg["memory"])]
    limits += [("RLIMIT_FSIZE", cfg["fsize"], cfg["fsize"]), ("RLIMIT_CORE", 0, 0), ("RLIMIT_NOFILE", 256, 256)]
    if cfg["nproc"] is not None:
        limits.append(("RLIMIT_NPROC", cfg["nproc"], cfg["nproc"]))
    for name, soft, hard in limits:
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError) as exc:
            fail(f"could not set {name}: {exc}")


def load_filters(programs: list[str]) -> None:
    """``no_new_privs``, then each seccomp filter (BPF, as hex, compiled by the parent with libseccomp)."""
    if not programs:
        return
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    lib = libc()
    ulong = ctypes.c_ulong
    if lib.prctl(PR_SET_NO_NEW_PRIVS, ulong(1), ulong(0), ulong(0), ulong(0)) != 0:
        fail(f"could not set no_new_privs: {os.strerror(ctypes.get_errno())}")
    for text in programs:
        program = bytes.fromhex(text)
        buffer = ctypes.create_string_buffer(program, len(program))
        fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
        if lib.prctl(PR_SET_SECCOMP, ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), ulong(0), ulong(0)) != 0:
            fail(f"could not load a seccomp filter: {os.strerror(ctypes.get_errno())}")
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]  # so the code's own import of ctypes is seen (and refused) by the audit hook


def load_guard(source: str) -> Callable[[str, tuple[str, ...], bool, bool], None]:
    """``install_guard`` from the guard's text, run in a namespace of its own (not this module's globals,
    which the model's code can reach as ``__main__``)."""
    namespace: dict[str, Any] = {"__name__": "lit_agentrl_sandbox_guard"}
    exec(compile(source, MARKER, "exec"), namespace)
    install: Callable[[str, tuple[str, ...], bool, bool], None] = namespace["install_guard"]
    return install


def reconfigure_streams() -> None:
    """UTF-8 stdout/stderr (undecodable characters escaped), flushed at each line."""
    for stream in (sys.stdout, sys.stderr):
        try:  # a TextIOWrapper here; typeshed's TextIO has no reconfigure
            stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)  # type: ignore[union-attr]
        except Exception:
            pass


def library_roots(site: bool) -> tuple[str, ...]:
    """The installation's library directories, which the code may read: ``sys.path``, and with ``site`` the
    site-packages directories, which are appended to ``sys.path`` (no ``.pth`` processing: editable
    installs, such as the project's, stay out)."""
    roots = [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)]
    if site:
        for path in site_dirs():
            if path not in sys.path:
                sys.path.append(path)
            roots.append(os.path.realpath(path))
    return tuple(sorted({r for r in roots if r != "/"}))


def site_dirs(every: bool = False) -> list[str]:
    """The site-packages folders ``site`` would add (``-S`` skips it, and with it a venv's own): a venv's, plus
    the base installation's where its ``pyvenv.cfg`` includes them; else the installation's. ``every``: the
    base installation's too, whatever ``pyvenv.cfg`` says (the parent hides them all without ``site``)."""
    import sysconfig

    venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    prefixes = [sys.prefix]
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        with open(os.path.join(venv, "pyvenv.cfg")) as f:
            shared = "include-system-site-packages=true" in f.read().replace(" ", "").lower()
        prefixes = [venv, sys.prefix] if shared or every else [venv]
    found = []
    for prefix in prefixes:
        paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})
        found += [paths[key] for key in ("purelib", "platlib") if os.path.isdir(paths[key])]
    return list(dict.fromkeys(found))


def disarm_unaudited_calls() -> None:
    """Take away what would reach processes or files without audit events (best effort)."""
    import _signal
    import types

    stub = types.ModuleType("_posixsubprocess")

    def fork_exec(*args: Any, **kwargs: Any) -> NoReturn:
        raise PermissionError("sandbox: starting programs is not allowed")

    stub.__dict__["fork_exec"] = fork_exec
    sys.modules["_posixsubprocess"] = stub
    for module in (os, sys.modules.get("posix"), _signal):
        for name in ("pidfd_open", "pidfd_send_signal", "mkfifo", "mknod"):
            try:
                delattr(module, name)
            except AttributeError:
                pass


def report_exception(exc: BaseException, traceback: ModuleType) -> None:
    """Print the traceback without the sandbox's own frames (``traceback`` is imported before the guard)."""
    try:
        top = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
        todo, seen = [top], set()
        while todo:
            te = todo.pop()
            if id(te) in seen:
                continue
            seen.add(id(te))
            frames = [f for f in te.stack if f.filename != MARKER]
            te.stack = traceback.StackSummary.from_list(frames)
            todo += [t for t in (te.__cause__, te.__context__) if t is not None]
        sys.stderr.write("".join(top.format()))
    except BaseException:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
    sys.stderr.flush()


def run_code(source: str, traceback: ModuleType) -> int:
    """Run the model's code as ``main.py`` in a namespace of its own; 1 (and the traceback) if it raised."""
    import builtins

    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    try:
        exec(compile(source, "main.py", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        report_exception(exc, traceback)
        return 1
    return 0


def main() -> int:
    """``sys.argv[1:]`` is this text, the run's JSON config, the guard's text."""
    cfg, guard_source = json.loads(sys.argv[2]), sys.argv[3]
    sys.argv[:] = ["main.py"]
    VERDICT_FD[0] = cfg["verdict_fd"]
    if cfg["supervise"]:
        supervise()
    try:
        source, traceback = prepare(cfg, guard_source)
        tell({"setup": "ok"})
        os.close(VERDICT_FD[0])  # before the code exists: it cannot write a verdict of its own
        VERDICT_FD[0] = -1
    except BaseException as exc:
        fail(f"{type(exc).__name__}: {exc}")
    if cfg["probe"]:
        print(json.dumps({"uid": os.getuid(), "guard": cfg["guard"], "cwd": os.getcwd()}))
        return 0
    return run_code(source, traceback)


def prepare(cfg: dict[str, Any], guard_source: str) -> tuple[str, ModuleType]:
    """Everything before the code: limits, filters, streams, the audit hook; the code's text and ``traceback``."""
    set_limits(cfg)
    load_filters(cfg["filters"])
    reconfigure_streams()
    work = os.path.realpath(cfg["dir"])
    roots = library_roots(cfg["site"])
    disarm_unaudited_calls()
    import linecache  # noqa: F401  (imported before the guard: needed to report errors)
    import traceback

    with open(os.path.join(work, "main.py"), encoding="utf-8", errors="replace") as f:
        source = f.read()
    if cfg["guard"]:
        load_guard(guard_source)(work, roots, cfg["allow_fork"], cfg["site"])
    return source, traceback


if __name__ == "__main__":
    sys.exit(main())
