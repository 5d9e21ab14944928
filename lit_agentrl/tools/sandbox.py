"""Run model-written Python code in a separate, limited process: :class:`PythonSandbox`.

Each run gets a fresh interpreter (``python -I -S -B``) in a new session (its own process group), in a
fresh temporary working directory that is deleted afterwards, with a minimal environment (no variable of
the trainer's environment reaches it: no ``PATH`` into the project, no ``HOME``, no ``WANDB_*``/``HF_*``
tokens), stdin on ``/dev/null``, no inherited file descriptors, and these limits
(:class:`SandboxLimits`): CPU seconds (``RLIMIT_CPU``), wall seconds (the whole process group is killed),
address space (``RLIMIT_AS``), size of written files (``RLIMIT_FSIZE``), no core dumps, at most 256 open
files, and output: at most ``output_bytes`` of stdout and of stderr are kept, the rest is read and
discarded, so neither a blocked pipe nor a flood of output reaches the trainer's memory.

Model code never makes :meth:`PythonSandbox.run` / :meth:`PythonSandbox.arun` raise: syntax errors,
exceptions, timeouts, limits and refused operations all come back as a :class:`SandboxResult`, whose
:meth:`SandboxResult.as_tool_text` is what the model is shown.

What it protects against, and how
---------------------------------
The child is started in two stages. Stage 1 (a tiny interpreter, before any model code exists in the
process) sets the resource limits, tries to move into a new network namespace, and, when the trainer runs
as root, drops to an unprivileged user id of its own; then it ``exec``s stage 2, a fresh interpreter that
installs a Python audit hook and runs the code. The layers, and what each one covers:

Kernel-enforced (they hold against any code, Python or not):
  * CPU, address-space, file-size, open-file limits; the wall-clock kill of the process group; the child
    gets SIGKILL if the trainer dies (``PR_SET_PDEATHSIG``). With ``max_processes > 0`` leftovers are also
    found by a per-run token in their command line and killed, even if they left the process group.
  * **Network namespace** (when ``network_isolated`` is True): the child has a network namespace of its
    own whose only interface is a loopback that is down, so it can reach nothing, neither the host's
    services nor the outside. It needs ``CAP_SYS_ADMIN`` (root) or unprivileged user namespaces; see
    ``PythonSandbox.network_isolated``. (Unix sockets on the filesystem are not covered by a network
    namespace: the privilege drop and the hook refuse them.)
  * **Privilege drop** (root only, when ``privileges_dropped`` is True): the code runs as a per-run
    unprivileged uid/gid with no supplementary groups and ``no_new_privs``. So it cannot signal or
    ptrace the trainer or any other process, cannot write to files it doesn't own (root's files, the
    project, the Python installation), has no capability (no raw sockets, mounts, …), and
    ``RLIMIT_NPROC`` applies: the uid may have ``1 + max_processes`` tasks, so a fork bomb (or a thread
    bomb) fails at once. When the Python installation is not readable by other users (e.g. under
    ``/root`` with mode 700, as in this repository's container) the uid keeps exactly one capability,
    ``CAP_DAC_READ_SEARCH`` (read any file), so that it can load the standard library: then reading is
    guarded by the audit hook only (below), writing and everything else stays kernel-enforced. The uid
    is drawn per run from a block of 65,536 ids at 2,000,000,000 (or the top of what the container
    maps); two trainer processes can, rarely, draw the same one for concurrent runs.
  * Not root: ``RLIMIT_NPROC`` is set (the kernel counts *all* processes of the user, so with
    ``max_processes=0`` the child can't create any process or thread; with more, the limit is the user's
    current count plus ``max_processes``). The child runs as the trainer's own user, so the kernel lets it
    signal the trainer and write the user's files: only the audit hook refuses those.
  * Running as root without the drop (``drop_privileges=False``, or the uid can't be used): ``RLIMIT_NPROC``
    is **not** enforced for root, the child could signal any process and write any file at the kernel
    level; only the audit hook and the process-group kill stand in the way (best effort, see below).

Audit hook (``sys.addaudithook``, installed before the code runs; Python code cannot remove it): refuses
  opening files for writing, and removing/renaming/chmod-ing paths, outside the working directory;
  opening for reading and listing directories outside the working directory and the Python
  installation's own library directories (the standard library, plus ``site-packages`` with
  ``site_packages=True``), so the project's files and ``/proc/<pid>/environ`` are unreadable; creating
  links; ``subprocess``, ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.fork`` (allowed only
  with ``max_processes > 0``); ``os.kill``/``killpg``/``pthread_kill``; every ``socket`` operation
  (also the fallback network block where no namespace is available); changing resource limits;
  ``sys.settrace``/``setprofile`` and ``gc`` introspection; importing ``ctypes``, ``_posixsubprocess``
  and a few modules whose C code touches files or processes without audit events. With
  ``site_packages=True``, ``ctypes`` can be imported (numpy, sympy and torch need it) and load libraries by
  name or from the installation, but symbol lookup, raw-memory reads and ``from_address`` are refused.

What it does NOT protect against
--------------------------------
* It is **not a security boundary against a determined attacker**. Audit hooks are documented by CPython
  as not being a sandbox: interpreter bugs, crafted objects (e.g. a custom ``os.PathLike`` whose
  ``__fspath__`` answers differently the second time) or C code reached in an unforeseen way can get past
  the hook; kernel exploits get past everything. The kernel layers above are what to rely on, and only
  where they are active (``network_isolated``, ``privileges_dropped``).
* With ``site_packages=True`` the hook is weaker still: ``ctypes.memmove`` and function pointers built from
  addresses are not audited by CPython, so code can write to its own interpreter's memory and disable the
  hook. Only the kernel layers hold then.
* ``os.stat`` and friends are not audited: the code can learn whether a path exists.
* Disk space: each file is limited to ``file_size_mb`` but the number of files is not; the run's time
  limits bound how much can be written. No ``/tmp`` quota.
* As root with ``CAP_DAC_READ_SEARCH`` kept, or as root without the drop, reading any file is possible at
  the kernel level (the hook refuses it for ordinary code).
* Timing, CPU-cache and other side channels; load on the host (use ``max_processes=0`` and modest
  limits, and bound how many runs are in flight).

For untrusted production use, run code in a separate, disposable machine or container: a remote sandbox
service. Anything with ``async def arun(self, code: str) -> SandboxResult`` satisfies :class:`CodeRunner`
and can be passed to the ``mathcode_agent`` instead of a :class:`PythonSandbox`::

    class RemoteRunner:
        def __init__(self, url): self.client = httpx.AsyncClient(base_url=url)
        async def arun(self, code: str) -> SandboxResult:
            reply = (await self.client.post("/run", json={"code": code}, timeout=30)).json()
            return SandboxResult(stdout=reply["stdout"], stderr=reply["stderr"], exit_code=reply["exit_code"],
                                 timed_out=reply["timed_out"], truncated=False, error=reply.get("error"))

(or set ``code_runner: "my_pkg.remote:make_runner"`` in the agent's YAML).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["CodeRunner", "PythonSandbox", "SandboxLimits", "SandboxResult"]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    cpu_seconds: float = 5.0
    """CPU time (``RLIMIT_CPU``, rounded up to whole seconds): SIGXCPU at the limit, SIGKILL a second later."""
    wall_seconds: float = 10.0
    """Wall-clock time from start; then the child's whole process group is killed (``timed_out``)."""
    memory_mb: int = 512
    """Address space (``RLIMIT_AS``): a bigger allocation raises ``MemoryError`` in the code."""
    output_bytes: int = 16_384
    """Bytes kept of stdout (its beginning) and of stderr (its end, where tracebacks are); the rest is
    read and discarded (``truncated`` is set and the kept text says how much was dropped)."""
    max_processes: int = 0
    """Extra processes/threads the code may create. 0: none (``os.fork`` refused by the audit hook, and
    ``RLIMIT_NPROC`` where the kernel enforces it: not for root, hence the privilege drop). Above 0,
    ``os.fork`` is allowed, limited by ``RLIMIT_NPROC`` (uid-wide, see the module docs); running other
    programs stays refused, and leftovers are killed by process group and by command line."""
    file_size_mb: int = 16
    """Largest file the code may write (``RLIMIT_FSIZE``)."""

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "output_bytes", "file_size_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")
        if self.max_processes < 0:
            raise ValueError(f"SandboxLimits.max_processes must be >= 0, got {self.max_processes!r}")


@dataclass
class SandboxResult:
    """What a run produced. ``error`` is None exactly when the code ran to the end and exited with 0."""

    stdout: str
    """Standard output (its first ``output_bytes``; a marker says when more was dropped)."""
    stderr: str
    """Standard error (its last ``output_bytes``; a marker says when earlier bytes were dropped)."""
    exit_code: int | None
    """The process's exit status; negative: killed by that signal; None: it never started."""
    timed_out: bool
    """True when the wall-clock limit killed it."""
    truncated: bool
    """True when output beyond ``output_bytes`` was discarded."""
    error: str | None
    """A description for the model: the traceback's tail, a timeout or limit, a setup failure."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_tool_text(self) -> str:
        """What the model sees: stdout on success, else what was printed followed by the error."""
        if self.error is None:
            return self.stdout.rstrip() if self.stdout.strip() else "(no output: print() the values you need)"
        printed = self.stdout.rstrip()
        return f"{printed}\n{self.error}" if printed else self.error


@runtime_checkable
class CodeRunner(Protocol):
    """Runs a piece of Python code; :class:`PythonSandbox` is one, a remote sandbox client can be another."""

    async def arun(self, code: str) -> SandboxResult: ...


# --------------------------------------------------------------------------------------------- the child

_MARKER = "<lit-agentrl-sandbox>"
"""The file name of the sandbox's own code in the child (hidden from tracebacks; found in its cmdline)."""
_LAUNCH = "import sys;exec(compile(sys.argv[1],'" + _MARKER + "','exec'))"
_SETUP_EXIT = 113
_SETUP_PREFIX = "lit-agentrl-sandbox setup: "

# Stage 1: limits, network namespace, privilege drop; then exec stage 2 (a fresh interpreter, so nothing
# used here, ctypes in particular, is reachable from the model's code). Started as
# ``python -I -S -B -c LAUNCH STAGE1 CONFIG STAGE2``, so sys.argv[1:] is STAGE1, CONFIG, STAGE2.
_STAGE1 = r'''
import json, os, sys
cfg = json.loads(sys.argv[2])

def fail(message):
    os.write(2, (cfg["setup_prefix"] + message + "\n").encode("utf-8", "replace"))
    os._exit(cfg["setup_exit"])

import resource

def limit(name, soft, hard=None):
    which = getattr(resource, name, None)
    if which is None:
        return
    hard = soft if hard is None else hard
    try:
        resource.setrlimit(which, (soft, hard))
    except (ValueError, OSError):
        top = resource.getrlimit(which)[1]
        if top != resource.RLIM_INFINITY:
            try:
                resource.setrlimit(which, (min(soft, top), min(hard, top)))
            except (ValueError, OSError):
                pass

limit("RLIMIT_CPU", cfg["cpu"], cfg["cpu"] + 1)
limit("RLIMIT_AS", cfg["memory"])
limit("RLIMIT_FSIZE", cfg["fsize"])
limit("RLIMIT_CORE", 0)
limit("RLIMIT_NOFILE", 256)
if cfg["nproc"] is not None:
    limit("RLIMIT_NPROC", cfg["nproc"])

_libc = []

def libc_call(name, *args):
    import ctypes
    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    fn = getattr(_libc[0], name)
    if fn(*[ctypes.c_ulong(a) if isinstance(a, int) else a for a in args]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))

CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000

def unshare(flags):
    if hasattr(os, "unshare"):
        os.unshare(flags)
    else:
        libc_call("unshare", flags)

netns = False
if cfg["netns"]:
    try:
        unshare(CLONE_NEWNET)
        netns = True
    except Exception:
        pass

def readable_by_others(path):
    import stat
    path = os.path.realpath(path)
    try:
        mode = os.stat(path).st_mode
        if (mode & 0o005) != 0o005 if stat.S_ISDIR(mode) else not mode & 0o004:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & 0o001:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False

keep_read = False
uid = cfg["uid"]
if uid is not None:
    needed = [p for p in sys.path if p and os.path.isdir(p)] + [sys.executable]
    if cfg["site"]:
        import sysconfig
        needed += [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    keep_read = not all(readable_by_others(p) for p in needed)
    try:
        if keep_read:
            libc_call("prctl", 8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if keep_read:
            import ctypes

            class Header(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

            class Data(ctypes.Structure):
                _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                            ("inheritable", ctypes.c_uint32)]

            data = (Data * 2)()
            data[0].effective = data[0].permitted = data[0].inheritable = 1 << 2  # CAP_DAC_READ_SEARCH
            libc_call("capset", ctypes.byref(Header(0x20080522, 0)), data)
            libc_call("prctl", 47, 2, 2, 0, 0)  # PR_CAP_AMBIENT_RAISE CAP_DAC_READ_SEARCH: kept across exec
            libc_call("prctl", 8, 0, 0, 0, 0)
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError("the uid did not change")
    except Exception as exc:
        fail("could not drop privileges to uid %d: %s" % (uid, exc))

if not netns and cfg["netns"] and not keep_read and os.geteuid() != 0:
    try:  # unprivileged: a user namespace of our own, with its own network namespace
        unshare(CLONE_NEWUSER | CLONE_NEWNET)
        netns = True
    except Exception:
        pass

for args in ((38, 1, 0, 0, 0), (1, 9, 0, 0, 0)):  # PR_SET_NO_NEW_PRIVS; PR_SET_PDEATHSIG SIGKILL
    try:
        libc_call("prctl", *args)
    except Exception:
        pass
if os.getppid() != cfg["ppid"]:
    fail("the trainer process went away")

cfg["netns_ok"], cfg["keep_read"], cfg["dropped"] = netns, keep_read, uid is not None
try:
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", "-c", cfg["launch"], sys.argv[3], json.dumps(cfg)])
except Exception as exc:
    fail("could not start the interpreter: %s" % exc)
'''

# Stage 2: runs in a fresh interpreter; installs the audit hook, then runs the model's code.
_STAGE2 = r'''
import json, os, sys


def _install_guard(work, roots, allow_fork, allow_ctypes):
    import posix, _stat
    lstat, stat_, readlink, getcwd, fspath = posix.lstat, posix.stat, posix.readlink, posix.getcwd, posix.fspath
    S_ISLNK, S_ISDIR = _stat.S_ISLNK, _stat.S_ISDIR
    str_, bytes_, int_, isinstance_, type_ = str, bytes, int, isinstance, type
    PermissionError_, ImportError_, OSError_ = PermissionError, ImportError, OSError
    ALL = slice(None)
    WRITE_FLAGS = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND
    work_roots = (work,)
    read_devices = frozenset(("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"))
    write_devices = frozenset(("/dev/null",))
    blocked_imports = frozenset(() if allow_ctypes else ("ctypes", "_ctypes")) | frozenset((
        "_posixsubprocess", "_posixshmem", "_multiprocessing", "readline", "_curses",
        "_curses_panel", "_dbm", "_gdbm", "_tkinter", "ossaudiodev", "_xxsubinterpreters",
    ))
    hot = frozenset((
        "compile", "exec", "object.__getattr__", "object.__setattr__", "object.__delattr__", "marshal.loads",
        "marshal.load", "marshal.dumps", "sys._getframe", "code.__new__", "function.__new__", "builtins.id",
        "sys.addaudithook", "time.sleep", "os.putenv", "os.unsetenv", "os.lockf", "array.__new__", "mmap.__new__",
        "pickle.find_class", "builtins.input", "builtins.input/result", "tempfile.mkstemp", "tempfile.mkdtemp",
        "pathlib.Path.glob", "pathlib.Path.rglob", "sys.excepthook", "sys.unraisablehook", "cpython.run_command",
        "sqlite3.connect/handle", "_thread.start_new_thread", "sys._current_frames", "sys._current_exceptions",
        "shutil.make_archive", "shutil.unpack_archive", "fcntl.fcntl", "fcntl.flock", "fcntl.lockf",
    ))
    refused = {
        "subprocess.Popen": "starting programs", "os.system": "starting programs", "os.exec": "starting programs",
        "os.posix_spawn": "starting programs", "os.spawn": "starting programs", "pty.spawn": "starting programs",
        "os.startfile": "starting programs", "webbrowser.open": "starting programs",
        "os.kill": "sending signals to processes", "os.killpg": "sending signals to processes",
        "signal.pthread_kill": "sending signals to threads", "os.link": "creating links",
        "os.symlink": "creating links", "resource.setrlimit": "changing resource limits",
        "resource.prlimit": "changing resource limits", "sys.settrace": "tracing",
        "sys.setprofile": "profiling hooks", "gc.get_objects": "garbage-collector introspection",
        "gc.get_referrers": "garbage-collector introspection", "gc.get_referents": "garbage-collector introspection",
        "fcntl.ioctl": "ioctl", "sqlite3.enable_load_extension": "loading sqlite extensions",
        "sqlite3.load_extension": "loading sqlite extensions", "os.add_dll_directory": "loading libraries",
    }
    # With site-packages (numpy, sympy and torch import ctypes) ctypes may be imported and load libraries
    # by name or from the installation, but not look up symbols, read raw memory or call by address.
    ctypes_ok = frozenset(("ctypes.addressof", "ctypes.create_string_buffer", "ctypes.create_unicode_buffer",
                           "ctypes.get_errno", "ctypes.set_errno", "ctypes.get_last_error", "ctypes.set_last_error"))
    refused_prefixes = (("socket.", "network access"), ("ctypes.", "ctypes"), ("syslog.", "syslog"),
                        ("http.client.", "network access"), ("ftplib.", "network access"),
                        ("smtplib.", "network access"), ("imaplib.", "network access"),
                        ("poplib.", "network access"), ("nntplib.", "network access"),
                        ("telnetlib.", "network access"), ("urllib.", "network access"), ("_winapi.", "winapi"))

    def deny(message):
        raise PermissionError_("sandbox: " + message + " is not allowed")

    def as_text(raw):
        # Exact str/bytes only: a subclass could override the methods used below.
        if not isinstance_(raw, (str_, bytes_)):
            raw = fspath(raw)
        if isinstance_(raw, str_):
            return str_.__getitem__(raw, ALL) if type_(raw) is not str_ else raw
        if isinstance_(raw, bytes_):
            return bytes_.__getitem__(raw, ALL).decode("utf-8", "surrogateescape")
        deny("this kind of path")

    def resolve(text):
        """Absolute path with '.', '..' and symbolic links resolved (missing parts kept as written)."""
        if not text.startswith("/"):
            text = getcwd() + "/" + text
        todo = text.split("/")
        todo.reverse()
        done = []
        hops = 0
        while todo:
            part = todo.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            candidate = "/".join(["", *done, part])
            try:
                mode = lstat(candidate).st_mode
            except (OSError_, ValueError):
                done.append(part)
                continue
            if S_ISLNK(mode):
                hops += 1
                if hops > 40:
                    deny("a path with this many symbolic links")
                target = readlink(candidate)
                if target.startswith("/"):
                    done = []
                pieces = target.split("/")
                pieces.reverse()
                todo.extend(pieces)
                continue
            done.append(part)
        return "/" + "/".join(done)

    def inside(path, bases):
        for base in bases:
            if path == base or path.startswith(base + "/"):
                return True
        return False

    def check_dir_fd(dir_fd):
        if dir_fd is not None and dir_fd != -1 and dir_fd != -100:
            deny("a path relative to a directory descriptor")

    def check_read(raw):
        """None when fine; the resolved path when it is inside the Python installation."""
        if raw is None or isinstance_(raw, int_):
            return None
        path = resolve(as_text(raw))
        if inside(path, work_roots) or path in read_devices:
            return None
        if inside(path, roots):
            return path
        deny("reading %r (outside the working directory)" % path)

    def check_write(raw, what, allow_fd=False):
        if raw is None:
            return
        if isinstance_(raw, int_):
            if allow_fd:
                return
            deny(what + " through a file descriptor")
        path = resolve(as_text(raw))
        if inside(path, work_roots) or path in write_devices:
            return
        deny("%s %r (outside the working directory)" % (what, path))

    def hook(event, args):
        if event in hot:
            return
        if event == "open":
            raw, mode, flags = args[0], args[1], args[2]
            if isinstance_(flags, int_):
                writing = flags & WRITE_FLAGS
            else:
                writing = mode is not None and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
            if writing:
                check_write(raw, "writing to", allow_fd=True)
                return
            path = check_read(raw)
            if path is not None:
                try:
                    mode = stat_(path).st_mode
                except (OSError_, ValueError):
                    return
                if S_ISDIR(mode):
                    deny("opening a directory outside the working directory")
            return
        if event == "import":
            name = as_text(args[0])
            if name in blocked_imports or name.partition(".")[0] in blocked_imports:
                raise ImportError_("sandbox: importing %s is not allowed" % name, name=name)
            return
        if event in ("os.listdir", "os.scandir", "os.chdir", "os.getxattr", "os.listxattr"):
            check_read(args[0])
            return
        if event == "os.walk":
            check_read(args[0])
            return
        if event in ("glob.glob", "glob.glob/2"):
            if len(args) > 3:
                check_dir_fd(args[3])
            return
        if event in ("os.mkdir", "os.chmod", "os.chown", "os.utime", "os.rmdir", "os.remove"):
            check_dir_fd(args[-1])
            check_write(args[0], {"os.mkdir": "creating", "os.rmdir": "removing", "os.remove": "removing"}.get(event, "changing"))
            return
        if event == "os.rename":
            check_dir_fd(args[2])
            check_dir_fd(args[3])
            check_write(args[0], "renaming")
            check_write(args[1], "renaming to")
            return
        if event == "os.truncate":
            check_write(args[0], "truncating", allow_fd=True)
            return
        if event in ("os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.chown"):
            check_write(args[0], "changing")
            return
        if event == "shutil.rmtree":
            if len(args) > 1:
                check_dir_fd(args[1])
            check_write(args[0], "removing")
            return
        if event in ("shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move"):
            check_read(args[0])
            check_write(args[1], "writing to")
            return
        if event == "sqlite3.connect":
            database = args[0]
            if isinstance_(database, (str_, bytes_)) and as_text(database) in (":memory:", ""):
                return
            if isinstance_(database, (str_, bytes_)) and as_text(database).startswith("file:"):
                deny("sqlite URIs")
            check_write(database, "opening the database")
            return
        if allow_ctypes and event in ctypes_ok:
            return
        if allow_ctypes and event == "ctypes.dlopen":
            name = args[0]
            if name is None:
                return
            text = as_text(name)
            if "/" not in text or inside(resolve(text), roots):
                return
            deny("loading the library %r" % text)
        if event in ("os.fork", "os.forkpty"):
            if not allow_fork:
                deny("creating processes (os.fork)")
            return
        what = refused.get(event)
        if what is not None:
            deny(what + " (" + event + ")")
        for prefix, what in refused_prefixes:
            if event.startswith(prefix):
                deny(what + " (" + event + ")")
        if event.startswith("os."):
            deny(event)

    sys.addaudithook(hook)


def _report(exc, traceback):
    """Print the traceback without the sandbox's own frames."""
    try:
        top = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
        todo, seen = [top], set()
        while todo:
            te = todo.pop()
            if id(te) in seen:
                continue
            seen.add(id(te))
            frames = [f for f in te.stack if f.filename != "''' + _MARKER + r'''"]
            te.stack = traceback.StackSummary.from_list(frames)
            todo += [t for t in (te.__cause__, te.__context__) if t is not None]
        sys.stderr.write("".join(top.format()))
    except BaseException:
        sys.stderr.write("%s: %s\n" % (type(exc).__name__, exc))
    sys.stderr.flush()


def _main():
    cfg = json.loads(sys.argv[2])
    sys.argv[:] = ["main.py"]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
        except Exception:
            pass
    work = os.path.realpath(cfg["dir"])
    roots = [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)]
    if cfg["site"]:
        import sysconfig
        for key in ("purelib", "platlib"):
            path = sysconfig.get_paths().get(key)
            if path and os.path.isdir(path):
                if path not in sys.path:
                    sys.path.append(path)  # no .pth processing: editable installs (the project) stay out
                roots.append(os.path.realpath(path))
    roots = tuple(sorted({r for r in roots if r != "/"}))
    # Take away what would reach processes or files without audit events (best effort).
    import types, _signal
    stub = types.ModuleType("_posixsubprocess")

    def fork_exec(*args, **kwargs):
        raise PermissionError("sandbox: starting programs is not allowed")

    stub.fork_exec = fork_exec
    sys.modules["_posixsubprocess"] = stub
    for module in (os, sys.modules.get("posix"), _signal):
        for name in ("pidfd_open", "pidfd_send_signal", "mkfifo", "mknod"):
            try:
                delattr(module, name)
            except AttributeError:
                pass
    import traceback, linecache  # noqa: F401  (imported before the hook: needed to report errors)
    with open(os.path.join(work, "main.py"), encoding="utf-8", errors="replace") as f:
        source = f.read()
    if cfg["guard"]:
        _install_guard(work, roots, cfg["allow_fork"], cfg["site"])
    if cfg["probe"]:
        print(json.dumps({"netns": cfg["netns_ok"], "dropped": cfg["dropped"], "keep_read": cfg["keep_read"],
                          "uid": os.getuid(), "guard": cfg["guard"]}))
        return 0
    import builtins
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    try:
        exec(compile(source, "main.py", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        _report(exc, traceback)
        return 1
    return 0


sys.exit(_main())
'''

_CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

# ------------------------------------------------------------------------------------------- the parent

_UID_SPAN = 1 << 16
_uid_counter = itertools.count(random.randrange(_UID_SPAN))
_probe_cache: dict[tuple, dict[str, Any]] = {}
_probe_lock = threading.Lock()


def _uid_base() -> int | None:
    """The first of ``_UID_SPAN`` uids this container maps that no account normally uses, or None."""
    try:
        with open("/proc/self/uid_map") as f:
            extents = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except (OSError, ValueError):
        extents = [(0, 0, 2**32 - 1)]
    preferred = 2_000_000_000
    for inside, _outside, length in extents:
        if inside <= preferred and preferred + _UID_SPAN <= inside + length:
            return preferred
    best = max(extents, key=lambda e: e[2], default=None)
    if best is None or best[2] < 4 * _UID_SPAN:
        return None
    return best[0] + best[2] - 2 * _UID_SPAN


def _user_task_count(uid: int) -> int:
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


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _kill_by_token(token: str) -> None:
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


class _Capture:
    """Keeps the head (stdout) or the tail (stderr) of a stream, at most ``limit`` bytes, and counts the rest."""

    def __init__(self, limit: int, tail: bool = False) -> None:
        self.limit, self.tail = limit, tail
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        if self.tail:
            self.data += chunk
            extra = len(self.data) - self.limit
            if extra > 0:
                del self.data[:extra]
                self.dropped += extra
        else:
            room = max(self.limit - len(self.data), 0)
            self.data += chunk[:room]
            self.dropped += max(len(chunk) - room, 0)

    def text(self) -> str:
        body = self.data.decode("utf-8", "replace")
        if not self.dropped:
            return body
        if self.tail:
            return f"[... {self.dropped} earlier bytes of stderr not shown ...]\n{body}"
        return f"{body}\n[... output truncated: {self.dropped} more bytes not shown ...]"


def _remove_tree(path: str) -> None:
    """Delete a run's directory, even where the code took away its own permissions."""

    def retry(func: Any, target: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def _tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


class PythonSandbox:
    """Runs Python code in a separate, limited, isolated process (see the module docs for the guarantees).

    Args:
        limits: resource limits of each run.
        python: the interpreter to run the code with (its standard library is readable to the code).
        site_packages: let the code import the interpreter's ``site-packages`` (numpy, sympy, ...); they
            become readable. ``.pth`` files are not processed, so editable installs (this project) stay out.
        drop_privileges: when the trainer runs as root, run the code as a per-run unprivileged uid.

    ``await sandbox.arun(code)`` never blocks the event loop; ``sandbox.run(code)`` blocks. Both return a
    :class:`SandboxResult` and never raise for problems of the code.
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),
        python: str = sys.executable,
        *,
        site_packages: bool = False,
        drop_privileges: bool = True,
    ) -> None:
        if not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
        if not python:
            raise ValueError("PythonSandbox needs a Python interpreter (sys.executable is empty)")
        self.limits = limits
        self.python = python
        self.site_packages = site_packages
        self.drop_privileges = drop_privileges
        self._guard = True  # tests switch the audit hook off to check the kernel-enforced layers alone

    def __repr__(self) -> str:
        return f"PythonSandbox(limits={self.limits!r}, python={self.python!r}, site_packages={self.site_packages})"

    # ---------------------------------------------------------------- isolation actually available here

    @property
    def isolation(self) -> dict[str, Any]:
        """What this machine allows, found once per interpreter by a probe run: ``netns`` (network
        namespace), ``dropped`` (root: runs as an unprivileged uid), ``keep_read`` (that uid keeps
        CAP_DAC_READ_SEARCH because the Python installation isn't readable by others), ``uid``."""
        want_drop = self.drop_privileges and os.geteuid() == 0
        key = (self.python, self.site_packages, want_drop)
        with _probe_lock:
            if key not in _probe_cache:
                report = None
                for drop, netns in dict.fromkeys([(want_drop, True), (want_drop, False), (False, True), (False, False)]):
                    report = self._probe(drop=drop, netns=netns)
                    if report is not None:
                        break
                _probe_cache[key] = report or {"netns": False, "dropped": False, "keep_read": False, "uid": None}
            return dict(_probe_cache[key])

    @property
    def network_isolated(self) -> bool:
        """True when runs get their own network namespace (kernel-enforced: no network at all). Either way
        the audit hook refuses sockets, which determined code could bypass (see the module docs)."""
        return bool(self.isolation["netns"])

    @property
    def privileges_dropped(self) -> bool:
        """True when (as root) the code runs as an unprivileged uid: kernel-enforced NPROC, kill, write limits."""
        return bool(self.isolation["dropped"])

    def _probe(self, drop: bool, netns: bool) -> dict[str, Any] | None:
        """Start a child that only reports what it got; None when that setup can't start here."""
        tmp, argv, env, token = self._prepare("", drop=drop, netns=netns, probe=True)
        try:
            done = subprocess.run(
                argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                start_new_session=True, close_fds=True,
            )
            if done.returncode != 0:
                return None
            return json.loads(done.stdout.decode().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None
        finally:
            _kill_by_token(token)
            _remove_tree(tmp)

    # ---------------------------------------------------------------------------------------- running

    def _prepare(
        self, code: str, drop: bool, netns: bool, probe: bool = False
    ) -> tuple[str, list[str], dict[str, str], str]:
        """The run's directory (with main.py), argv, environment and command-line token."""
        limits = self.limits
        root = os.geteuid() == 0
        uid = None
        if drop and root:
            base = _uid_base()
            if base is not None:
                uid = base + next(_uid_counter) % _UID_SPAN
        if uid is not None:
            nproc: int | None = 1 + limits.max_processes
        elif root:
            nproc = None  # the kernel doesn't apply RLIMIT_NPROC to root
        elif limits.max_processes == 0:
            nproc = 1  # counts every task of the user, so the child can't create any
        else:
            nproc = _user_task_count(os.getuid()) + limits.max_processes
        tmp = os.path.realpath(tempfile.mkdtemp(prefix="lit-agentrl-sandbox-"))
        try:
            path = os.path.join(tmp, "main.py")
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(code)
            if uid is not None:
                os.chown(tmp, uid, uid)
                os.chown(path, uid, uid)
        except BaseException:
            _remove_tree(tmp)
            raise
        token = f"lit-agentrl-run-{os.getpid()}-{next(_uid_counter)}-{random.getrandbits(48):012x}"
        cfg = {
            "token": token,
            "dir": tmp,
            "cpu": max(1, math.ceil(limits.cpu_seconds)),
            "memory": int(limits.memory_mb) * 2**20,
            "fsize": int(limits.file_size_mb) * 2**20,
            "nproc": nproc,
            "uid": uid,
            "netns": netns,
            "site": self.site_packages,
            "allow_fork": limits.max_processes > 0,
            "guard": self._guard,
            "probe": probe,
            "ppid": os.getpid(),
            "launch": _LAUNCH,
            "setup_exit": _SETUP_EXIT,
            "setup_prefix": _SETUP_PREFIX,
        }
        argv = [self.python, "-I", "-S", "-B", "-c", _LAUNCH, _STAGE1, json.dumps(cfg), _STAGE2]
        env = dict(_CHILD_ENV, HOME=tmp, TMPDIR=tmp)
        return tmp, argv, env, token

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
            return _failure(f"TypeError: the code must be a string, got {type(code).__name__}")
        limits = self.limits
        try:
            iso = await asyncio.to_thread(lambda: self.isolation)
            tmp, argv, env, token = await asyncio.to_thread(self._prepare, code, iso["dropped"], iso["netns"])
        except Exception as exc:  # the machine, not the code: still an answer, not an exception
            return _failure(f"SandboxError: could not prepare the run: {type(exc).__name__}: {exc}")
        out, err = _Capture(limits.output_bytes), _Capture(limits.output_bytes, tail=True)
        proc = pumps = None
        timed_out = False
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=tmp, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, close_fds=True,
            )
            pumps = asyncio.gather(_pump(proc.stdout, out), _pump(proc.stderr, err))
            try:
                await asyncio.wait_for(proc.wait(), timeout=limits.wall_seconds)
            except asyncio.TimeoutError:
                timed_out = True
                _kill_group(proc.pid)
                await proc.wait()
            if limits.max_processes > 0:  # children may outlive the run, in its group or not
                _kill_group(proc.pid)
                _kill_by_token(token)
            try:
                await asyncio.wait_for(pumps, timeout=2.0)
            except asyncio.TimeoutError:  # a leftover still holds the pipes
                _discard(pumps)
            result = _result(proc.returncode, timed_out, out, err, limits)
        except asyncio.CancelledError:
            if proc is not None and proc.returncode is None:
                _kill_group(proc.pid)
            if pumps is not None:
                _discard(pumps)
            _kill_by_token(token)
            _remove_tree(tmp)
            raise
        except Exception as exc:
            if proc is not None and proc.returncode is None:
                _kill_group(proc.pid)
            if pumps is not None:
                _discard(pumps)
            result = _failure(f"SandboxError: {type(exc).__name__}: {exc}")
        finally:
            _close_transport(proc)
        await asyncio.to_thread(_remove_tree, tmp)
        return result


def _discard(future: asyncio.Future) -> None:
    """Cancel the pipe readers without leaving an unretrieved exception behind."""
    future.cancel()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


def _close_transport(proc: asyncio.subprocess.Process | None) -> None:
    """Close the child's pipes now (asyncio keeps them open while unread output is buffered)."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        try:
            transport.close()
        except Exception:
            pass


async def _pump(stream: asyncio.StreamReader | None, capture: _Capture) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        capture.add(chunk)


def _failure(error: str) -> SandboxResult:
    return SandboxResult(stdout="", stderr="", exit_code=None, timed_out=False, truncated=False, error=error)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _result(code: int | None, timed_out: bool, out: _Capture, err: _Capture, limits: SandboxLimits) -> SandboxResult:
    stdout, stderr = out.text(), err.text()
    error: str | None = None
    if timed_out:
        error = f"TimeoutError: the code did not finish within {limits.wall_seconds:g} seconds and was stopped."
    elif code == -signal.SIGXCPU:
        error = f"TimeoutError: the code used more than {limits.cpu_seconds:g} seconds of CPU time and was stopped."
    elif code == -signal.SIGKILL:
        error = "Killed: the code exceeded its CPU time or memory limit and was stopped."
    elif code is not None and code < 0:
        error = f"Killed by {_signal_name(-code)}." + (f"\n{_tail(stderr)}" if stderr.strip() else "")
    elif code == _SETUP_EXIT and stderr.startswith(_SETUP_PREFIX):
        error = "SandboxError: " + stderr[len(_SETUP_PREFIX) :].strip()
    elif code != 0:
        error = _tail(stderr.strip()) or f"the code exited with status {code}"
    return SandboxResult(
        stdout=stdout, stderr=stderr, exit_code=code, timed_out=timed_out,
        truncated=bool(out.dropped or err.dropped), error=error,
    )


def limits_from_mapping(mapping: Any) -> SandboxLimits:
    """``SandboxLimits`` from a mapping (e.g. the agent YAML's ``sandbox:``); unknown keys are an error."""
    if mapping is None:
        return SandboxLimits()
    if hasattr(mapping, "items"):
        values = {str(k): v for k, v in mapping.items()}
    else:
        raise TypeError(f"sandbox limits must be a mapping of SandboxLimits fields, got {type(mapping).__name__}")
    known = set(asdict(SandboxLimits()))
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown sandbox limit(s) {unknown}; the fields are {sorted(known)}")
    return SandboxLimits(**values)
