"""The audit hook that stage 2 installs before the model's code runs: the guard.

The child does not import this module (it cannot import the project): the parent reads this file's text
and passes it to the child after stage 2's, and stage 2 compiles it into a namespace of its own and calls
:func:`install_guard`. Hence: the standard library only, ASCII only, nothing done at import but
definitions (tests call the factories below without installing anything).

How the guard resists tampering. The model's code can reach the hook's frames (a refusal's traceback,
``sys._getframe`` inside a callback such as ``__fspath__``), and from them every object the hook uses. So
nothing the hook uses can be changed: the ``make_*`` factories run once, before the model's code exists,
and return functions without closures (a closure's cells can be rebound, unaudited) whose state is in
their positional defaults: the interpreter's primitives (``posix.lstat``, ``isinstance``, ...), frozensets,
tuples, read-only mapping proxies and each other. They read no global name (a test checks their bytecode),
so rebinding the guard's module names changes nothing. Replacing a function's ``__code__`` or defaults is
audited, and the hook refuses it for the sandbox's own functions; ``sys.addaudithook`` hooks can be neither
removed nor listed. What stays possible is reading the hook's state (harmless), and the interpreter-level
attacks docs/sandbox.md lists: the kernel's layers are the boundary, this hook the second layer.
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
    "compile", "exec", "object.__getattr__", "marshal.loads",
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

FUNCTION_STATE = frozenset(("__code__", "__defaults__", "__kwdefaults__"))
"""Function attributes whose change is audited (``object.__setattr__``); refused for the sandbox's own."""
SANDBOX_FILE = "<lit-agentrl-sandbox>"
"""The file name the sandbox's own code is compiled under in the child (``stage2.MARKER``)."""

READ_DEVICES = frozenset(("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"))
WRITE_DEVICES = frozenset(("/dev/null",))
CHANGE_VERBS = {"os.mkdir": "creating", "os.rmdir": "removing", "os.remove": "removing"}
"""How refusals name the path events handled together (others: "changing"). (Handlers hold a copy.)"""


def make_deny() -> Deny:
    """``deny(what)`` raises ``PermissionError("sandbox: <what> is not allowed")``."""

    def deny(message: str, _error: Any = PermissionError) -> NoReturn:
        raise _error("sandbox: " + message + " is not allowed")

    return deny


def make_path_tools(deny: Deny) -> PathTools:
    """``(as_text, resolve, inside)``: a path argument as exact ``str``; that text absolute, with ``.``,
    ``..`` and symbolic links resolved; whether a resolved path is one of ``bases`` or below one."""
    import _stat
    import posix

    def as_text(
        raw: Any, _fspath: Any = posix.fspath, _str: Any = str, _bytes: Any = bytes, _isinstance: Any = isinstance,
        _type: Any = type, _all: Any = slice(None), _deny: Deny = deny,
    ) -> str:  # fmt: skip
        # Exact str/bytes only: a subclass could override the methods used below.
        if not _isinstance(raw, (_str, _bytes)):
            raw = _fspath(raw)
        if _isinstance(raw, _str):
            return _str.__getitem__(raw, _all) if _type(raw) is not _str else raw
        if _isinstance(raw, _bytes):
            return _bytes.__getitem__(raw, _all).decode("utf-8", "surrogateescape")
        _deny("this kind of path")

    def resolve(
        text: str, _lstat: Any = posix.lstat, _readlink: Any = posix.readlink, _getcwd: Any = posix.getcwd,
        _islink: Any = _stat.S_ISLNK, _errors: Any = (OSError, ValueError), _deny: Deny = deny,
    ) -> str:  # fmt: skip
        """Absolute path with '.', '..' and symbolic links resolved (missing parts kept as written)."""
        if not text.startswith("/"):
            text = _getcwd() + "/" + text
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
                mode = _lstat(candidate).st_mode
            except _errors:
                done.append(part)
                continue
            if _islink(mode):
                hops += 1
                if hops > 40:
                    _deny("a path with this many symbolic links")
                target = _readlink(candidate)
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
    file descriptor); ``check_write(raw, what, allow_fd=False)`` names the refused action ``what``.

    A relative path is resolved against the working directory, but ``dir_fd=`` arguments are not in the
    audit events: so a relative path may not climb above where it starts (``../x``), and a file descriptor
    given as a path must lead into ``work`` (its ``/proc/self/fd`` link is read)."""
    import posix

    as_text, resolve, inside = tools

    def climbs(text: str) -> bool:
        depth = 0
        for part in text.split("/"):
            if part == "..":
                depth -= 1
                if depth < 0:
                    return True
            elif part != "" and part != ".":
                depth += 1
        return False

    def check_dir_fd(dir_fd: Any, _deny: Deny = deny) -> None:
        if dir_fd is not None and dir_fd != -1 and dir_fd != -100:
            _deny("a path relative to a directory descriptor")

    def fd_path(
        fd: int, _readlink: Any = posix.readlink, _errors: Any = (OSError, ValueError), _str: Any = int.__repr__
    ) -> str | None:
        """The path a file descriptor is open on (None: a pipe, a socket, ... or no such descriptor)."""
        try:
            target = _readlink("/proc/self/fd/" + _str(fd))
        except _errors:
            return None
        return target if target.startswith("/") else None

    def checked(
        raw: Any, _as_text: Any = as_text, _resolve: Any = resolve, _climbs: Any = climbs, _deny: Deny = deny,
    ) -> str:  # fmt: skip
        text = _as_text(raw)
        if not text.startswith("/") and _climbs(text):
            _deny(f"the relative path {text!r}, which climbs out of its directory,")
        return _resolve(text)

    def check_read(
        raw: Any, _int: Any = int, _isinstance: Any = isinstance, _fd_path: Any = fd_path, _checked: Any = checked,
        _inside: Any = inside, _work: Any = (work,), _roots: Any = roots, _devices: Any = READ_DEVICES,
        _deny: Deny = deny,
    ) -> str | None:  # fmt: skip
        """None when fine; the resolved path when it is inside the Python installation."""
        if raw is None:
            return None
        if _isinstance(raw, _int):
            path = _fd_path(raw)
            if path is None:
                return None
        else:
            path = _checked(raw)
        if _inside(path, _work) or path in _devices:
            return None
        if _inside(path, _roots):
            return path
        _deny(f"reading {path!r} (outside the working directory)")

    def check_write(
        raw: Any, what: str, allow_fd: bool = False, _int: Any = int, _isinstance: Any = isinstance,
        _checked: Any = checked, _inside: Any = inside, _work: Any = (work,), _devices: Any = WRITE_DEVICES,
        _deny: Deny = deny,
    ) -> None:  # fmt: skip
        if raw is None:
            return
        if _isinstance(raw, _int):
            if allow_fd:
                return
            _deny(what + " through a file descriptor")
        path = _checked(raw)
        if _inside(path, _work) or path in _devices:
            return
        _deny(f"{what} {path!r} (outside the working directory)")

    return check_dir_fd, check_read, check_write


def make_open_handlers(deny: Deny, checks: PathChecks) -> dict[str, Handler]:
    """Opening files (writing only in the run's directory; no directory of the installation) and listing."""
    import _stat
    import posix

    check_dir_fd, check_read, check_write = checks

    def on_open(
        event: str, args: tuple[Any, ...], _int: Any = int, _isinstance: Any = isinstance,
        _write_flags: Any = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND,
        _check_read: Any = check_read, _check_write: Any = check_write, _stat_: Any = posix.stat,
        _isdir: Any = _stat.S_ISDIR, _errors: Any = (OSError, ValueError), _deny: Deny = deny,
    ) -> None:  # fmt: skip
        raw, mode, flags = args[0], args[1], args[2]
        if _isinstance(flags, _int):
            writing = flags & _write_flags
        else:
            writing = mode is not None and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
        if writing:
            _check_write(raw, "writing to", True)
            return
        path = _check_read(raw)
        if path is not None:
            try:
                st_mode = _stat_(path).st_mode
            except _errors:
                return
            if _isdir(st_mode):
                _deny("opening a directory outside the working directory")

    def on_read(event: str, args: tuple[Any, ...], _check_read: Any = check_read) -> None:
        _check_read(args[0])

    def on_glob(event: str, args: tuple[Any, ...], _check_dir_fd: Any = check_dir_fd, _len: Any = len) -> None:
        if _len(args) > 3:
            _check_dir_fd(args[3])

    handlers: dict[str, Handler] = {"open": on_open, "glob.glob": on_glob, "glob.glob/2": on_glob}
    for event in ("os.listdir", "os.scandir", "os.chdir", "os.getxattr", "os.listxattr", "os.walk", "os.fwalk"):
        handlers[event] = on_read
    return handlers


def make_change_handlers(deny: Deny, tools: PathTools, checks: PathChecks) -> dict[str, Handler]:
    """Creating, removing, renaming, copying and changing paths: only in the run's directory."""
    import types

    as_text = tools[0]
    check_dir_fd, check_read, check_write = checks

    def on_change(
        event: str, args: tuple[Any, ...], _check_dir_fd: Any = check_dir_fd, _check_write: Any = check_write,
        _verbs: Any = types.MappingProxyType(dict(CHANGE_VERBS)),
    ) -> None:  # fmt: skip
        _check_dir_fd(args[-1])
        _check_write(args[0], _verbs.get(event, "changing"))

    def on_rename(
        event: str, args: tuple[Any, ...], _check_dir_fd: Any = check_dir_fd, _check_write: Any = check_write
    ) -> None:
        _check_dir_fd(args[2])
        _check_dir_fd(args[3])
        _check_write(args[0], "renaming")
        _check_write(args[1], "renaming to")

    def on_truncate(event: str, args: tuple[Any, ...], _check_write: Any = check_write) -> None:
        _check_write(args[0], "truncating", True)

    def on_attributes(event: str, args: tuple[Any, ...], _check_write: Any = check_write) -> None:
        _check_write(args[0], "changing")

    def on_rmtree(
        event: str, args: tuple[Any, ...], _check_dir_fd: Any = check_dir_fd, _check_write: Any = check_write,
        _len: Any = len,
    ) -> None:  # fmt: skip
        if _len(args) > 1:
            _check_dir_fd(args[1])
        _check_write(args[0], "removing")

    def on_copy(
        event: str, args: tuple[Any, ...], _check_read: Any = check_read, _check_write: Any = check_write
    ) -> None:
        _check_read(args[0])
        _check_write(args[1], "writing to")

    def on_sqlite(
        event: str, args: tuple[Any, ...], _text: Any = (str, bytes), _isinstance: Any = isinstance,
        _as_text: Any = as_text, _check_write: Any = check_write, _deny: Deny = deny,
    ) -> None:  # fmt: skip
        database = args[0]
        if _isinstance(database, _text) and _as_text(database) in (":memory:", ""):
            return
        if _isinstance(database, _text) and _as_text(database).startswith("file:"):
            _deny("sqlite URIs")
        _check_write(database, "opening the database")

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

    def on_import(
        event: str, args: tuple[Any, ...], _as_text: Any = tools[0], _error: Any = ImportError,
        _blocked: Any = BLOCKED_IMPORTS if allow_ctypes else BLOCKED_IMPORTS | CTYPES_MODULES,
    ) -> None:  # fmt: skip
        name = _as_text(args[0])
        if name in _blocked or name.partition(".")[0] in _blocked:
            raise _error(f"sandbox: importing {name} is not allowed", name=name)

    return {"import": on_import}


def make_ctypes_handlers(roots: tuple[str, ...], deny: Deny, tools: PathTools) -> dict[str, Handler]:
    """With site-packages: the ctypes events of ``CTYPES_OK_EVENTS``, and loading libraries by name or from
    ``roots`` (the other ``ctypes.*`` events stay refused by prefix)."""
    as_text, resolve, inside = tools

    def allow(event: str, args: tuple[Any, ...]) -> None:
        return None

    def on_dlopen(
        event: str, args: tuple[Any, ...], _as_text: Any = as_text, _resolve: Any = resolve, _inside: Any = inside,
        _roots: Any = roots, _deny: Deny = deny,
    ) -> None:  # fmt: skip
        name = args[0]
        if name is None:
            return
        text = _as_text(name)
        if "/" not in text or _inside(_resolve(text), _roots):
            return
        _deny(f"loading the library {text!r}")

    handlers: dict[str, Handler] = dict.fromkeys(CTYPES_OK_EVENTS, allow)
    handlers["ctypes.dlopen"] = on_dlopen
    return handlers


def make_process_handlers(deny: Deny, allow_fork: bool) -> dict[str, Handler]:
    """``os.fork`` only with ``allow_fork`` (``max_processes > 0``); starting programs is refused elsewhere."""

    def on_fork(event: str, args: tuple[Any, ...], _allow: Any = allow_fork, _deny: Deny = deny) -> None:
        if not _allow:
            _deny("creating processes (os.fork)")

    return {"os.fork": on_fork, "os.forkpty": on_fork}


def make_tamper_handlers(deny: Deny, own_files: frozenset[str]) -> dict[str, Handler]:
    """Replacing the code or the defaults of the sandbox's own functions (compiled from ``own_files``)."""

    function_type = type(make_deny)

    def on_attribute(
        event: str, args: tuple[Any, ...], _names: Any = FUNCTION_STATE, _function: Any = function_type,
        _type: Any = type, _own: Any = own_files, _deny: Deny = deny,
    ) -> None:  # fmt: skip
        if args[1] in _names and _type(args[0]) is _function and args[0].__code__.co_filename in _own:
            _deny("changing the sandbox's own functions")

    return {"object.__setattr__": on_attribute, "object.__delattr__": on_attribute}


def make_hook(handlers: dict[str, Handler], deny: Deny) -> Handler:
    """The audit hook: hot events pass; an event with a handler is the handler's to refuse; the rest of
    ``REFUSED_EVENTS``, ``REFUSED_PREFIXES`` and ``os.*`` is refused; anything else passes."""
    import types

    def hook(
        event: str, args: tuple[Any, ...], _hot: Any = HOT_EVENTS, _prefixes: Any = REFUSED_PREFIXES,
        _handler_for: Any = types.MappingProxyType(dict(handlers)).get,
        _refusal_for: Any = types.MappingProxyType(dict(REFUSED_EVENTS)).get, _deny: Deny = deny,
    ) -> None:  # fmt: skip
        if event in _hot:
            return
        handler = _handler_for(event)
        if handler is not None:
            handler(event, args)
            return
        what = _refusal_for(event)
        if what is not None:
            _deny(what + " (" + event + ")")
        for prefix, what in _prefixes:
            if event.startswith(prefix):
                _deny(what + " (" + event + ")")
        if event.startswith("os."):
            _deny(event)

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
    handlers.update(make_tamper_handlers(deny, frozenset((SANDBOX_FILE, make_deny.__code__.co_filename))))
    return make_hook(handlers, deny)


def install_guard(work: str, roots: tuple[str, ...], allow_fork: bool, allow_ctypes: bool) -> None:
    """Install the guard for good: an audit hook cannot be removed (never call this in the trainer)."""
    sys.addaudithook(make_guard(work, roots, allow_fork, allow_ctypes))
