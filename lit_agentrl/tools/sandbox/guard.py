"""The audit hook that stage 2 installs before the model's code runs: the guard.

The child does not import this module (it cannot import the project): the parent reads this file's text
and passes it to the child after stage 2's, and stage 2 compiles it into a namespace of its own and calls
:func:`install_guard`. Hence: the standard library only, ASCII only, nothing done at import but
definitions (tests call the factories below without installing anything).

How the guard resists tampering. The model's code can rebind the globals of any module it reaches, and can
replace the code of any function object it reaches (``f.__code__ = ...`` is not refused). So the hook uses
no module-level name when an event comes: the ``make_*`` factories below run once, before the model's code
exists, and return fresh closures over their locals: the interpreter's primitives (``posix.lstat``,
``isinstance``, ...), the event tables (copied where they are mutable) and each other. The hook reaches
them through its closure cells only, and ``sys.addaudithook`` hooks can be neither removed nor listed, so
rebinding names afterwards changes nothing. That is why the guard is a set of factories and not of
module-level functions. It does not make the hook a security boundary (see the README's sandbox section):
for one, the frames of a refused call, the hook's among them, stay reachable from its exception's traceback.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is not imported in the child: it would cost every run its import time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

    Deny = Callable[[str], NoReturn]
    Handler = Callable[[str, tuple[Any, ...]], None]
    PathTools = tuple[Callable[[Any], str], Callable[[str], str], Callable[[str, tuple[str, ...]], bool]]
    PathChecks = tuple[Callable[[Any], None], Callable[[Any], str | None], Callable[..., None]]

HOT_EVENTS = frozenset((
    "compile", "exec", "object.__getattr__", "object.__setattr__", "object.__delattr__", "marshal.loads",
    "marshal.load", "marshal.dumps", "sys._getframe", "code.__new__", "function.__new__", "builtins.id",
    "sys.addaudithook", "time.sleep", "os.putenv", "os.unsetenv", "os.lockf", "array.__new__", "mmap.__new__",
    "pickle.find_class", "builtins.input", "builtins.input/result", "tempfile.mkstemp", "tempfile.mkdtemp",
    "pathlib.Path.glob", "pathlib.Path.rglob", "sys.excepthook", "sys.unraisablehook", "cpython.run_command",
    "sqlite3.connect/handle", "_thread.start_new_thread", "sys._current_frames", "sys._current_exceptions",
    "shutil.make_archive", "shutil.unpack_archive", "fcntl.fcntl", "fcntl.flock", "fcntl.lockf",
))  # fmt: skip
"""Frequent or harmless events, allowed before anything else is looked at."""

REFUSED_EVENTS = {
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
}  # fmt: skip
"""Events refused outright, with what the refusal calls them. (The hook holds a copy.)"""

REFUSED_PREFIXES = (
    ("socket.", "network access"), ("ctypes.", "ctypes"), ("syslog.", "syslog"),
    ("http.client.", "network access"), ("ftplib.", "network access"), ("smtplib.", "network access"),
    ("imaplib.", "network access"), ("poplib.", "network access"), ("nntplib.", "network access"),
    ("telnetlib.", "network access"), ("urllib.", "network access"), ("_winapi.", "winapi"),
)  # fmt: skip
"""Families of events refused outright, after the exact names; any other ``os.*`` event is refused too."""

CTYPES_OK_EVENTS = frozenset((
    "ctypes.addressof", "ctypes.create_string_buffer", "ctypes.create_unicode_buffer", "ctypes.get_errno",
    "ctypes.set_errno", "ctypes.get_last_error", "ctypes.set_last_error",
))  # fmt: skip
"""With site-packages (numpy, sympy and torch import ctypes) ctypes may be imported and load libraries by
name or from the installation, and do these; not look up symbols, read raw memory or call by address."""

CTYPES_MODULES = frozenset(("ctypes", "_ctypes"))
BLOCKED_IMPORTS = frozenset((
    "_posixsubprocess", "_posixshmem", "_multiprocessing", "readline", "_curses", "_curses_panel", "_dbm",
    "_gdbm", "_tkinter", "ossaudiodev", "_xxsubinterpreters",
))  # fmt: skip
"""Modules whose C code reaches files or processes without audit events (ctypes too, without site-packages)."""

READ_DEVICES = frozenset(("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"))
WRITE_DEVICES = frozenset(("/dev/null",))
CHANGE_VERBS = {"os.mkdir": "creating", "os.rmdir": "removing", "os.remove": "removing"}
"""How refusals name the path events handled together (others: "changing"). (Handlers hold a copy.)"""


def make_deny() -> Deny:
    """``deny(what)`` raises ``PermissionError("sandbox: <what> is not allowed")``."""
    PermissionError_ = PermissionError  # bound now: see the module docstring

    def deny(message: str) -> NoReturn:
        raise PermissionError_("sandbox: " + message + " is not allowed")

    return deny


def make_path_tools(deny: Deny) -> PathTools:
    """``(as_text, resolve, inside)``: a path argument as exact ``str``; that text absolute, with ``.``,
    ``..`` and symbolic links resolved; whether a resolved path is one of ``bases`` or below one."""
    import _stat
    import posix

    # bound now: see the module docstring
    lstat, readlink, getcwd, fspath = posix.lstat, posix.readlink, posix.getcwd, posix.fspath
    S_ISLNK = _stat.S_ISLNK
    str_, bytes_, isinstance_, type_ = str, bytes, isinstance, type
    OSError_, ValueError_ = OSError, ValueError
    ALL = slice(None)

    def as_text(raw: Any) -> str:
        # Exact str/bytes only: a subclass could override the methods used below.
        if not isinstance_(raw, (str_, bytes_)):
            raw = fspath(raw)
        if isinstance_(raw, str_):
            return str_.__getitem__(raw, ALL) if type_(raw) is not str_ else raw
        if isinstance_(raw, bytes_):
            return bytes_.__getitem__(raw, ALL).decode("utf-8", "surrogateescape")
        deny("this kind of path")

    def resolve(text: str) -> str:
        """Absolute path with '.', '..' and symbolic links resolved (missing parts kept as written)."""
        if not text.startswith("/"):
            text = getcwd() + "/" + text
        todo = text.split("/")
        todo.reverse()
        done: list[str] = []
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
            except (OSError_, ValueError_):
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

    def inside(path: str, bases: tuple[str, ...]) -> bool:
        for base in bases:  # noqa: SIM110 (any() would be a builtins lookup at event time, see above)
            if path == base or path.startswith(base + "/"):
                return True
        return False

    return as_text, resolve, inside


def make_path_checks(work: str, roots: tuple[str, ...], deny: Deny, tools: PathTools) -> PathChecks:
    """``(check_dir_fd, check_read, check_write)`` for the run's directory ``work`` and the readable
    library ``roots``; each returns when the access is allowed and raises ``PermissionError`` otherwise.
    ``check_read`` returns the resolved path when it lies in ``roots`` (None when in ``work``, a device or a
    file descriptor); ``check_write(raw, what, allow_fd=False)`` names the refused action ``what``."""
    as_text, resolve, inside = tools
    int_, isinstance_ = int, isinstance  # bound now: see the module docstring
    work_roots = (work,)
    read_devices, write_devices = READ_DEVICES, WRITE_DEVICES

    def check_dir_fd(dir_fd: Any) -> None:
        if dir_fd is not None and dir_fd != -1 and dir_fd != -100:
            deny("a path relative to a directory descriptor")

    def check_read(raw: Any) -> str | None:
        """None when fine; the resolved path when it is inside the Python installation."""
        if raw is None or isinstance_(raw, int_):
            return None
        path = resolve(as_text(raw))
        if inside(path, work_roots) or path in read_devices:
            return None
        if inside(path, roots):
            return path
        deny(f"reading {path!r} (outside the working directory)")

    def check_write(raw: Any, what: str, allow_fd: bool = False) -> None:
        if raw is None:
            return
        if isinstance_(raw, int_):
            if allow_fd:
                return
            deny(what + " through a file descriptor")
        path = resolve(as_text(raw))
        if inside(path, work_roots) or path in write_devices:
            return
        deny(f"{what} {path!r} (outside the working directory)")

    return check_dir_fd, check_read, check_write


def make_open_handlers(deny: Deny, checks: PathChecks) -> dict[str, Handler]:
    """Opening files (writing only in the run's directory; no directory of the installation) and listing."""
    import _stat
    import posix

    check_dir_fd, check_read, check_write = checks
    stat_, S_ISDIR = posix.stat, _stat.S_ISDIR
    int_, isinstance_, len_ = int, isinstance, len  # bound now: see the module docstring
    OSError_, ValueError_ = OSError, ValueError
    WRITE_FLAGS = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND

    def on_open(event: str, args: tuple[Any, ...]) -> None:
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
            except (OSError_, ValueError_):
                return
            if S_ISDIR(mode):
                deny("opening a directory outside the working directory")

    def on_read(event: str, args: tuple[Any, ...]) -> None:
        check_read(args[0])

    def on_glob(event: str, args: tuple[Any, ...]) -> None:
        if len_(args) > 3:
            check_dir_fd(args[3])

    handlers: dict[str, Handler] = {"open": on_open, "glob.glob": on_glob, "glob.glob/2": on_glob}
    for event in ("os.listdir", "os.scandir", "os.chdir", "os.getxattr", "os.listxattr", "os.walk"):
        handlers[event] = on_read
    return handlers


def make_change_handlers(deny: Deny, tools: PathTools, checks: PathChecks) -> dict[str, Handler]:
    """Creating, removing, renaming, copying and changing paths: only in the run's directory."""
    as_text = tools[0]
    check_dir_fd, check_read, check_write = checks
    str_, bytes_, isinstance_, len_ = str, bytes, isinstance, len  # bound now: see the module docstring
    verbs = dict(CHANGE_VERBS)

    def on_change(event: str, args: tuple[Any, ...]) -> None:
        check_dir_fd(args[-1])
        check_write(args[0], verbs.get(event, "changing"))

    def on_rename(event: str, args: tuple[Any, ...]) -> None:
        check_dir_fd(args[2])
        check_dir_fd(args[3])
        check_write(args[0], "renaming")
        check_write(args[1], "renaming to")

    def on_truncate(event: str, args: tuple[Any, ...]) -> None:
        check_write(args[0], "truncating", allow_fd=True)

    def on_attributes(event: str, args: tuple[Any, ...]) -> None:
        check_write(args[0], "changing")

    def on_rmtree(event: str, args: tuple[Any, ...]) -> None:
        if len_(args) > 1:
            check_dir_fd(args[1])
        check_write(args[0], "removing")

    def on_copy(event: str, args: tuple[Any, ...]) -> None:
        check_read(args[0])
        check_write(args[1], "writing to")

    def on_sqlite(event: str, args: tuple[Any, ...]) -> None:
        database = args[0]
        if isinstance_(database, (str_, bytes_)) and as_text(database) in (":memory:", ""):
            return
        if isinstance_(database, (str_, bytes_)) and as_text(database).startswith("file:"):
            deny("sqlite URIs")
        check_write(database, "opening the database")

    handlers: dict[str, Handler] = {
        "os.rename": on_rename,
        "os.truncate": on_truncate,
        "shutil.rmtree": on_rmtree,
        "sqlite3.connect": on_sqlite,
    }
    for event in ("os.mkdir", "os.chmod", "os.chown", "os.utime", "os.rmdir", "os.remove"):
        handlers[event] = on_change
    for event in ("os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.chown"):
        handlers[event] = on_attributes
    for event in ("shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move"):
        handlers[event] = on_copy
    return handlers


def make_import_handlers(tools: PathTools, allow_ctypes: bool) -> dict[str, Handler]:
    """Importing the modules of ``BLOCKED_IMPORTS`` (and ctypes, unless ``allow_ctypes``) raises ImportError."""
    as_text = tools[0]
    ImportError_ = ImportError  # bound now: see the module docstring
    blocked = BLOCKED_IMPORTS if allow_ctypes else BLOCKED_IMPORTS | CTYPES_MODULES

    def on_import(event: str, args: tuple[Any, ...]) -> None:
        name = as_text(args[0])
        if name in blocked or name.partition(".")[0] in blocked:
            raise ImportError_(f"sandbox: importing {name} is not allowed", name=name)

    return {"import": on_import}


def make_ctypes_handlers(roots: tuple[str, ...], deny: Deny, tools: PathTools) -> dict[str, Handler]:
    """With site-packages: the ctypes events of ``CTYPES_OK_EVENTS``, and loading libraries by name or from
    ``roots`` (the other ``ctypes.*`` events stay refused by prefix)."""
    as_text, resolve, inside = tools

    def allow(event: str, args: tuple[Any, ...]) -> None:
        return None

    def on_dlopen(event: str, args: tuple[Any, ...]) -> None:
        name = args[0]
        if name is None:
            return
        text = as_text(name)
        if "/" not in text or inside(resolve(text), roots):
            return
        deny(f"loading the library {text!r}")

    handlers: dict[str, Handler] = dict.fromkeys(CTYPES_OK_EVENTS, allow)
    handlers["ctypes.dlopen"] = on_dlopen
    return handlers


def make_process_handlers(deny: Deny, allow_fork: bool) -> dict[str, Handler]:
    """``os.fork`` only with ``allow_fork`` (``max_processes > 0``); starting programs is refused elsewhere."""

    def on_fork(event: str, args: tuple[Any, ...]) -> None:
        if not allow_fork:
            deny("creating processes (os.fork)")

    return {"os.fork": on_fork, "os.forkpty": on_fork}


def make_hook(handlers: dict[str, Handler], deny: Deny) -> Handler:
    """The audit hook: hot events pass; an event with a handler is the handler's to refuse; the rest of
    ``REFUSED_EVENTS``, ``REFUSED_PREFIXES`` and ``os.*`` is refused; anything else passes."""
    hot, prefixes = HOT_EVENTS, REFUSED_PREFIXES  # bound now: see the module docstring
    handler_for, refusal_for = dict(handlers).get, dict(REFUSED_EVENTS).get

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in hot:
            return
        handler = handler_for(event)
        if handler is not None:
            handler(event, args)
            return
        what = refusal_for(event)
        if what is not None:
            deny(what + " (" + event + ")")
        for prefix, what in prefixes:
            if event.startswith(prefix):
                deny(what + " (" + event + ")")
        if event.startswith("os."):
            deny(event)

    return hook


def make_guard(work: str, roots: tuple[str, ...], allow_fork: bool, allow_ctypes: bool) -> Handler:
    """The whole audit hook for a run in ``work`` that may read ``roots``; :func:`install_guard` installs it."""
    deny = make_deny()
    tools = make_path_tools(deny)
    checks = make_path_checks(work, roots, deny, tools)
    handlers = make_open_handlers(deny, checks)
    handlers.update(make_change_handlers(deny, tools, checks))
    handlers.update(make_import_handlers(tools, allow_ctypes))
    if allow_ctypes:
        handlers.update(make_ctypes_handlers(roots, deny, tools))
    handlers.update(make_process_handlers(deny, allow_fork))
    return make_hook(handlers, deny)


def install_guard(work: str, roots: tuple[str, ...], allow_fork: bool, allow_ctypes: bool) -> None:
    """Install the guard for good: an audit hook cannot be removed (never call this in the trainer)."""
    sys.addaudithook(make_guard(work, roots, allow_fork, allow_ctypes))
