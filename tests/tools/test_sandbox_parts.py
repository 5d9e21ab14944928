"""The sandbox's parts, tested directly in this process: no sandboxed interpreter is started here.

Limits and results, the host-side helpers (bubblewrap's arguments, the seccomp filters, the cgroups), and the
child's own code (the stage, the guard), which the child gets as text but which is importable here. The guard is built and called as a plain function, never
installed: an audit hook cannot be removed, so installing it would confine the test process itself.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shlex
import signal
import site
import sys
from pathlib import Path

import pytest

from lit_agentrl.tools.sandbox import (
    SandboxLimits,
    SandboxResult,
    boundary,
    cgroups,
    guard,
    limits_from_mapping,
    runner,
    stage,
    syscalls,
)
from lit_agentrl.tools.sandbox.processes import UID_SPAN, remove_tree, uid_base
from lit_agentrl.tools.sandbox.results import FLOOD_FACTOR, OutputCapture, failure, result_from_exit
from lit_agentrl.tools.sandbox.verdict import Verdict, outcome, parse_verdict

# ----------------------------------------------------------------------------------- limits and results


def test_limits_from_mapping():
    assert limits_from_mapping(None) == SandboxLimits()
    assert limits_from_mapping({"cpu_seconds": 2}).cpu_seconds == 2
    with pytest.raises(ValueError, match="unknown sandbox limit"):
        limits_from_mapping({"cpu": 2})
    with pytest.raises(TypeError, match="mapping"):
        limits_from_mapping([("cpu_seconds", 2)])
    with pytest.raises(ValueError, match="wall_seconds must be positive"):
        SandboxLimits(wall_seconds=0)
    with pytest.raises(ValueError, match="max_processes"):
        SandboxLimits(max_processes=-1)


def test_tool_text_shows_output_then_error():
    ok = SandboxResult(stdout="42\n", stderr="", exit_code=0, timed_out=False, truncated=False, error=None)
    assert ok.ok and ok.as_tool_text() == "42"
    silent = SandboxResult(stdout=" \n", stderr="", exit_code=0, timed_out=False, truncated=False, error=None)
    assert silent.as_tool_text().startswith("(no output")
    broken = SandboxResult(stdout="partial\n", stderr="", exit_code=1, timed_out=False, truncated=False, error="E")
    assert not broken.ok and broken.as_tool_text() == "partial\nE"
    assert failure("SandboxError: x").as_tool_text() == "SandboxError: x"


def test_capture_keeps_the_head_of_stdout_and_the_tail_of_stderr():
    head, tail = OutputCapture(4), OutputCapture(4, tail=True)
    for chunk in (b"abc", b"def", b"gh"):
        head.add(chunk)
        tail.add(chunk)
    assert head.text() == "abcd\n[... output truncated: 4 more bytes not shown ...]"
    assert tail.text() == "[... 4 earlier bytes of stderr not shown ...]\nefgh"
    small = OutputCapture(10)
    small.add(b"hi")
    assert small.text() == "hi" and small.dropped == 0


def _outcome(code: int | None, stderr: bytes = b"", timed_out: bool = False, stdout: bytes = b"") -> SandboxResult:
    out, err = OutputCapture(100), OutputCapture(100, tail=True)
    out.add(stdout)
    err.add(stderr)
    return result_from_exit(code, timed_out, out, err, SandboxLimits(cpu_seconds=1.5, wall_seconds=3))


def test_exit_status_becomes_the_error_text():
    assert _outcome(0, stdout=b"1\n").error is None
    assert _outcome(-signal.SIGKILL, timed_out=True).error.startswith("TimeoutError: the code did not finish within 3 ")
    assert "more than 1.5 seconds of CPU" in _outcome(-signal.SIGXCPU).error
    assert _outcome(-signal.SIGKILL).error.startswith("Killed: the code exceeded its CPU time or memory")
    assert _outcome(-signal.SIGSEGV, b"Fatal Python error").error == "Killed by SIGSEGV.\nFatal Python error"
    assert _outcome(-200).error == "Killed by signal 200."
    forged = _outcome(stage.SETUP_EXIT, (stage.SETUP_PREFIX + "could not load a seccomp filter\n").encode())
    assert forged.error == stage.SETUP_PREFIX + "could not load a seccomp filter"  # the code's own words
    assert _outcome(152).error == "the code exited with status 152"  # not a CPU-time signal: only a verdict says so
    out, err = OutputCapture(100), OutputCapture(100, tail=True)
    broken = result_from_exit(1, False, out, err, SandboxLimits(), sandbox_error="could not load a seccomp filter")
    assert broken.error == "SandboxError: could not load a seccomp filter"
    assert _outcome(1, b"Traceback ...\nValueError: x\n").error == "Traceback ...\nValueError: x"
    assert _outcome(3).error == "the code exited with status 3"
    assert _outcome(0, stdout=b"x" * 200).truncated


def test_uid_base_prefers_2e9_and_needs_a_big_enough_map(tmp_path):
    def base(text: str) -> int | None:
        (tmp_path / "uid_map").write_text(text)
        return uid_base(str(tmp_path / "uid_map"))

    assert base("0 0 4294967295\n") == 2_000_000_000
    assert base("0 100000 65536\n") is None  # a typical rootless container: too few ids to spare
    assert base("0 100000 1000000\n") == 1_000_000 - 2 * UID_SPAN
    assert uid_base(str(tmp_path / "missing")) == 2_000_000_000


# ---------------------------------------------------------------------------- the child's code, as text

CHILD_MODULES = [stage, guard]


@pytest.mark.parametrize("module", CHILD_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_child_code_is_standard_library_only_ascii_and_inert_on_import(module):
    source = Path(module.__file__).read_text(encoding="utf-8")
    assert source.isascii()  # it travels in argv, whatever the locale
    assert len(source.encode()) < 128 * 1024  # one argv string (MAX_ARG_STRLEN)
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)
    # Run only as __main__: at the top level, nothing but imports, definitions, constants and the main guard.
    for node in ast.parse(source).body:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            assert test in ("TYPE_CHECKING", "__name__ == '__main__'"), test
        elif isinstance(node, ast.Expr):  # docstrings only, no calls
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        else:
            assert isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Assign, ast.AnnAssign))


def test_the_runner_sends_exactly_these_files():
    assert Path(stage.__file__).read_text(encoding="utf-8") == runner.STAGE_SOURCE
    assert Path(guard.__file__).read_text(encoding="utf-8") == runner.GUARD_SOURCE
    assert stage.MARKER in runner.LAUNCH and guard.SANDBOX_FILE == stage.MARKER


def test_load_guard_keeps_the_guard_out_of_the_stages_globals():
    install = stage.load_guard(runner.GUARD_SOURCE)  # loaded, never called: it would confine this process
    assert install.__name__ == "install_guard" and install.__code__.co_filename == stage.MARKER
    assert install.__globals__ is not vars(stage) and "install_guard" not in vars(stage)


# ---------------------------------------------------------------------------------------------- stage


def test_report_leaves_out_the_sandboxs_own_frames(capsys):
    namespace: dict = {}
    exec(compile("def call(f):\n    return f()\n", stage.MARKER, "exec"), namespace)
    exec(compile("def fail():\n    raise ValueError('boom')\n", "main.py", "exec"), namespace)
    with pytest.raises(ValueError) as caught:
        namespace["call"](namespace["fail"])
    stage.report_exception(caught.value, __import__("traceback"))
    text = capsys.readouterr().err
    assert 'File "main.py", line 2, in fail' in text and text.endswith("ValueError: boom\n")
    assert stage.MARKER not in text


def test_run_code_returns_the_exit_status(capsys):
    import traceback

    assert stage.run_code("print(6 * 7)", traceback) == 0
    assert stage.run_code("1 / 0", traceback) == 1
    with pytest.raises(SystemExit):
        stage.run_code("raise SystemExit(3)", traceback)
    out, err = capsys.readouterr()
    assert out == "42\n" and err.endswith("ZeroDivisionError: division by zero\n")


def test_library_roots_are_resolved_directories_of_sys_path():
    roots = stage.library_roots(site=False)
    assert roots == tuple(sorted(roots)) and "/" not in roots
    assert all(os.path.isdir(r) and os.path.realpath(r) == r for r in roots)
    assert os.path.realpath(os.path.dirname(os.__file__)) in roots


# ------------------------------------------------------------------------------------------ the guard


@pytest.fixture()
def layout(tmp_path, monkeypatch):
    """A run's folder, a library root beside it, and the working directory in the run's folder."""
    work, lib, elsewhere = tmp_path / "work", tmp_path / "lib", tmp_path / "elsewhere"
    for folder in (work, lib, elsewhere):
        folder.mkdir()
    (lib / "mod.py").write_text("")
    (elsewhere / "secret.txt").write_text("")
    monkeypatch.chdir(work)
    return work, lib, elsewhere


def test_resolve_follows_dots_and_symbolic_links(layout):
    work, _lib, elsewhere = layout
    deny = guard.make_deny()
    as_text, resolve, inside = guard.make_path_tools(deny)
    assert resolve("a/./b/../c") == f"{work}/a/c" and resolve("/../..") == "/"
    os.symlink(elsewhere, work / "out")
    os.symlink("out/secret.txt", work / "relative")
    assert resolve("out/secret.txt") == resolve("relative") == f"{elsewhere}/secret.txt"
    os.symlink("loop", work / "loop")
    with pytest.raises(PermissionError, match="many symbolic links"):
        resolve("loop")
    assert as_text(b"caf\xc3\xa9") == "café" and as_text(Path("/x")) == "/x"
    assert type(as_text(type("Sub", (str,), {})("/x"))) is str  # a str subclass can't override methods here
    assert inside("/a/b/c", ("/a/b",)) and inside("/a/b", ("/a/b",)) and not inside("/a/bc", ("/a/b",))


def test_path_checks(layout):
    work, lib, elsewhere = layout
    deny = guard.make_deny()
    check_dir_fd, check_read, check_write = guard.make_path_checks(
        str(work), (str(lib),), deny, guard.make_path_tools(deny)
    )
    assert check_read("main.py") is None and check_read("/dev/urandom") is None and check_read(3) is None
    assert check_read(lib / "mod.py") == f"{lib}/mod.py"
    with pytest.raises(PermissionError, match=r"sandbox: reading '.*secret.txt' \(outside the working directory\)"):
        check_read(elsewhere / "secret.txt")
    check_write("new.txt", "writing to")
    check_write("/dev/null", "writing to")
    check_write(5, "truncating", allow_fd=True)
    with pytest.raises(PermissionError, match="changing through a file descriptor"):
        check_write(5, "changing")
    with pytest.raises(PermissionError, match=r"writing to '.*mod\.py'"):
        check_write(lib / "mod.py", "writing to")
    os.symlink(elsewhere, work / "out")
    with pytest.raises(PermissionError, match="outside the working directory"):
        check_write("out/secret.txt", "writing to")  # through a link in the run's own folder
    check_dir_fd(None)
    check_dir_fd(-100)  # AT_FDCWD
    with pytest.raises(PermissionError, match="directory descriptor"):
        check_dir_fd(7)


def _hook(work, lib, allow_fork=False, allow_ctypes=False):
    return guard.make_guard(str(work), (str(lib),), allow_fork, allow_ctypes)


@pytest.mark.parametrize(
    ("event", "args", "refusal"),
    [
        ("socket.connect", (None, ("127.0.0.1", 9)), "network access (socket.connect)"),
        ("subprocess.Popen", ("ls", ["ls"], None, None), "starting programs (subprocess.Popen)"),
        ("os.kill", (1, 9), "sending signals to processes"),
        ("os.fork", (), "creating processes (os.fork)"),
        ("os.setuid", (0,), "sandbox: os.setuid is not allowed"),  # any other os.* event
        ("ctypes.dlsym", (None, "system"), "ctypes (ctypes.dlsym)"),
        ("sys.settrace", (), "tracing"),
        ("open", ("/etc/passwd", "a", None), "writing to '/etc/passwd'"),  # no flags: the mode says
        ("open", ("/etc/passwd", None, os.O_WRONLY), "writing to '/etc/passwd'"),
        ("os.rename", ("main.py", "/tmp/x", None, None), "renaming to '/tmp/x'"),
        ("os.remove", ("/etc/passwd", None), "removing '/etc/passwd'"),
        ("os.chmod", ("/etc/passwd", 0o777, None), "changing '/etc/passwd'"),
        ("shutil.copyfile", ("main.py", "/tmp/x"), "writing to '/tmp/x'"),
        ("sqlite3.connect", ("file:x?mode=rw",), "sqlite URIs"),
        ("glob.glob/2", ("*", False, False, 5), "directory descriptor"),
    ],
)
def test_the_hook_refuses(layout, event, args, refusal):
    with pytest.raises(PermissionError, match=r"^sandbox: .*is not allowed$") as refused:
        _hook(*layout[:2])(event, args)
    assert refusal in str(refused.value)


@pytest.mark.parametrize(
    ("event", "args"),
    [
        ("compile", (b"", "<x>")),
        ("time.sleep", (1,)),
        ("open", ("main.py", None, os.O_WRONLY | os.O_CREAT)),
        ("open", ("/dev/urandom", "rb", 0)),
        ("os.listdir", (".",)),
        ("os.mkdir", ("d", 0o777, -1)),
        ("sqlite3.connect", (":memory:",)),
        ("import", ("json", None, [], [], [])),
        ("some.library.event", ()),
    ],
)
def test_the_hook_allows(layout, event, args):
    _hook(*layout[:2])(event, args)


def test_the_hook_refuses_listing_or_opening_library_directories(layout):
    work, lib, _ = layout
    hook = _hook(work, lib)
    hook("open", (str(lib / "mod.py"), "r", 0))  # reading a library file
    with pytest.raises(PermissionError, match="opening a directory outside the working directory"):
        hook("open", (str(lib), "r", 0))


def test_the_hook_with_forks_and_ctypes_allowed(layout):
    work, lib, _ = layout
    strict, lenient = _hook(work, lib), _hook(work, lib, allow_fork=True, allow_ctypes=True)
    with pytest.raises(ImportError, match="importing ctypes is not allowed"):
        strict("import", ("ctypes", None, [], [], []))
    with pytest.raises(ImportError, match="importing _posixsubprocess"):
        lenient("import", ("_posixsubprocess", None, [], [], []))
    lenient("import", ("ctypes.util", None, [], [], []))
    lenient("os.fork", ())
    lenient("ctypes.addressof", (object(),))
    lenient("ctypes.dlopen", ("libm.so.6",))  # by name
    lenient("ctypes.dlopen", (str(lib / "mod.py"),))  # from the installation
    with pytest.raises(PermissionError, match=r"loading the library '/tmp/evil\.so'"):
        lenient("ctypes.dlopen", ("/tmp/evil.so",))
    with pytest.raises(PermissionError, match="ctypes"):
        lenient("ctypes.dlsym", (None, "system"))


def test_rebinding_the_guards_module_names_afterwards_changes_nothing(layout, monkeypatch):
    """The hook holds its own tables and functions: what the model's code could rebind is not used."""
    hook = _hook(*layout[:2])
    monkeypatch.setattr(guard, "HOT_EVENTS", frozenset(("os.kill", "socket.connect")))
    monkeypatch.delitem(guard.REFUSED_EVENTS, "os.kill")  # mutated in place: the hook has a copy
    monkeypatch.setattr(guard, "REFUSED_PREFIXES", ())
    monkeypatch.setattr(guard, "make_deny", lambda: lambda message: None)
    with pytest.raises(PermissionError, match="sending signals"):
        hook("os.kill", (1, 9))
    with pytest.raises(PermissionError, match="network access"):
        hook("socket.connect", (None, ("127.0.0.1", 9)))


def _guard_functions(hook) -> list:
    """Every function the hook reaches: through defaults, and the handlers' read-only mapping."""
    import types

    seen, todo = {}, [hook]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen[id(fn)] = fn
        for value in fn.__defaults__ or ():
            owner = getattr(value, "__self__", None)
            table = list(owner.values()) if isinstance(owner, types.MappingProxyType) else []
            todo += [v for v in (value, *table) if isinstance(v, types.FunctionType)]
    return list(seen.values())


def test_nothing_the_hook_uses_can_be_changed(layout):
    """No closure cells (rebindable, unaudited), no global names read at event time, no mutable tables."""
    import dis
    import types

    functions = _guard_functions(_hook(*layout[:2], allow_ctypes=True))
    assert len(functions) > 15
    for fn in functions:
        assert fn.__closure__ is None and not fn.__kwdefaults__, fn.__name__
        loads = {i.opname for i in dis.get_instructions(fn)}
        assert not loads & {"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLOSURE", "STORE_GLOBAL"}, fn.__name__
        for value in fn.__defaults__ or ():
            assert not isinstance(value, (dict, list, set)), (fn.__name__, value)
            assert not isinstance(getattr(value, "__self__", None), (dict, list, set)), (fn.__name__, value)
    assert any(isinstance(getattr(v, "__self__", None), types.MappingProxyType) for v in functions[0].__defaults__)


def test_the_hook_refuses_changing_its_own_functions(layout):
    hook = _hook(*layout[:2])
    own = _guard_functions(hook)[1]
    for name in ("__code__", "__defaults__", "__kwdefaults__"):
        with pytest.raises(PermissionError, match="changing the sandbox's own functions"):
            hook("object.__setattr__", (own, name, None))
    with pytest.raises(PermissionError, match="changing the sandbox's own functions"):
        hook("object.__delattr__", (own, "__defaults__"))
    hook("object.__setattr__", (lambda: None, "__code__", None))  # the code's own functions: its business
    hook("object.__setattr__", (own, "__doc__", None))


def test_relative_paths_may_not_climb_and_descriptors_are_followed(layout):
    work, lib, elsewhere = layout
    hook = _hook(work, lib)
    (work / "sub").mkdir()
    hook("open", ("sub/../main.py", "r", 0))
    with pytest.raises(PermissionError, match="climbs out of its directory"):
        hook("open", ("../work/main.py", "r", 0))  # resolves inside, but under dir_fd= it could be anywhere
    fd = os.open(elsewhere, os.O_RDONLY)
    try:
        with pytest.raises(PermissionError, match="outside the working directory"):
            hook("os.listdir", (fd,))
    finally:
        os.close(fd)
    fd = os.open(work, os.O_RDONLY)
    try:
        hook("os.listdir", (fd,))
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------ the host's side


def test_the_flood_and_memory_errors_name_their_limit():
    flooded = _outcome(-signal.SIGKILL, stdout=b"x" * 10)
    assert flooded.error.startswith("Killed")  # (without the flag: an ordinary kill)
    limits = SandboxLimits(output_bytes=100, memory_mb=64)
    text = result_from_exit(-9, False, OutputCapture(100), OutputCapture(100, tail=True), limits, flooded=True).error
    assert text.startswith(f"OutputError: the code printed more than {FLOOD_FACTOR * 100} bytes")
    text = result_from_exit(-9, False, OutputCapture(100), OutputCapture(100), limits, out_of_memory=True).error
    assert text.startswith("MemoryError: the code used more than its 64 MB")


def test_the_boundary_filter_compiles_and_names_real_system_calls():
    if syscalls.seccomp_missing():
        pytest.skip(syscalls.seccomp_missing())
    import pyseccomp

    program = syscalls.boundary_filter()
    assert len(program) % 8 == 0 and len(program) > 8 * 100  # BPF instructions: one check per denied call at least
    known = [
        n
        for names in syscalls.DENIED.values()
        for n in names
        if pyseccomp.resolve_syscall(pyseccomp.system_arch(), n) >= 0
    ]
    assert len(known) > 0.9 * sum(map(len, syscalls.DENIED.values()))  # the list is not mostly typos
    assert "memfd_create" in known and "open_by_handle_at" in known and "keyctl" in known
    assert len(syscalls.exec_filter()) < len(program)


def test_remove_tree_removes_a_deep_locked_tree(tmp_path):
    top = tmp_path / "run"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(1200):  # deeper than Python's recursion limit (and than PATH_MAX, as a path)
        os.mkdir("dd", dir_fd=fd)
        inner = os.open("dd", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    os.chmod(top / "dd", 0o000)
    remove_tree(str(top))
    remove_tree(str(tmp_path / "missing"))  # never raises
    assert not top.exists()


def test_bubblewraps_arguments(monkeypatch):
    mounts = boundary.RunMounts(binds=("/opt/py", "/root/py"), hidden=("/opt/py/lib/site-packages",))
    monkeypatch.setattr(boundary, "reachable_by", lambda uid, path: path != "/root/py")
    run = boundary.Boundary(
        mounts,
        uid=2_000_000_001,
        scratch_bytes=2**20,
        cgroup_procs=("/cg/run/cgroup.procs",),
        env={"HOME": boundary.RUN_DIR},
        code_fd=5,
        seccomp_fd=6,
        info_fd=7,
    )
    argv = run.argv(["python", "-c", "x"])
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    script = argv[-1]
    top = boundary.mount_point()
    assert (
        "mount -t tmpfs -o size=1048576,nr_inodes=4096,mode=0700,uid=2000000001,gid=2000000001,noexec,nosuid,nodev"
        in script
    )
    assert f"mount --bind /root/py {top}/ro/1" in script and "/opt/py " + top not in script  # only the unreachable one
    assert "echo $$ > /cg/run/cgroup.procs" in script
    last = shlex.split(script.splitlines()[-1])
    assert last[:8] == [
        "exec",
        "setpriv",
        "--reuid",
        "2000000001",
        "--regid",
        "2000000001",
        "--clear-groups",
        "--inh-caps=-all",
    ]
    bwrap = last[last.index("bwrap") :]
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--as-pid-1",
    ):
        assert flag in bwrap, flag
    pairs = list(zip(bwrap, bwrap[1:], bwrap[2:]))
    assert ("--ro-bind", "/opt/py", "/opt/py") in pairs and ("--ro-bind", f"{top}/ro/1", "/root/py") in pairs
    assert ("--bind", f"{top}/home", boundary.RUN_DIR) in pairs and ("--bind", f"{top}/shm", "/dev/shm") in pairs
    assert bwrap.index("/tmp") < bwrap.index("/opt/py")  # an interpreter under /tmp is bound over the run's /tmp
    assert ("--tmpfs", "/opt/py/lib/site-packages", "--remount-ro") in pairs
    assert ("--seccomp", "6", "--chdir") in pairs and ("--file", "5", f"{boundary.RUN_DIR}/main.py") in pairs
    assert ("--as-pid-1", "--info-fd", "7") in pairs
    assert bwrap[-4:] == ["--", "python", "-c", "x"]
    unprivileged = dataclasses.replace(run, uid=None).argv(["python"])
    assert unprivileged[:4] == ["unshare", "--user", "--map-root-user", "--mount"] and "setpriv" not in unprivileged[-1]


def test_interpreter_layout_binds_the_prefixes_and_hides_site_packages():
    """Whatever the interpreter (a venv or not, under /tmp or not, its base's site-packages shared or not): every
    prefix is bound, no bind lies inside another, and the site-packages hidden are those ``site`` would not add
    (with ``site=True``: a venv's base installation's, unless the venv includes them), all of them without."""
    layout = boundary.interpreter_layout(sys.executable, site=False)
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        real = os.path.realpath(prefix)
        assert any(real == b or real.startswith(b + "/") for b in (*layout.binds, *boundary.SYSTEM_DIRS)), real
    assert all(not a.startswith(b + "/") for a in layout.binds for b in layout.binds)  # no bind inside another
    used = {os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p)}  # as this interpreter's site
    assert layout.hidden and all(os.path.isdir(h) for h in layout.hidden) and used <= set(layout.hidden)
    assert set(boundary.interpreter_layout(sys.executable, site=True).hidden) == set(layout.hidden) - used


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cgroups_are_made_with_their_limits_and_removed(tmp_path, monkeypatch, version):
    """Against a fake /sys/fs/cgroup: the files the kernel reads, in each layout."""
    if version == "v1":
        (tmp_path / "memory" / "trainer").mkdir(parents=True)
        (tmp_path / "pids").mkdir()
        for folder in (tmp_path / "memory", tmp_path / "pids"):
            (folder / "cgroup.procs").write_text("")
        proc = "5:memory:/trainer\n4:pids:/\n0::/\n"
    else:
        (tmp_path / "trainer").mkdir()
        (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
        (tmp_path / "trainer" / "cgroup.controllers").write_text("memory pids\n")
        (tmp_path / "trainer" / "cgroup.subtree_control").write_text("")
        proc = "0::/trainer\n"
    (tmp_path / "proc_cgroup").write_text(proc)
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    monkeypatch.setattr(cgroups, "_own_groups", lambda: cgroups._parse(str(tmp_path / "proc_cgroup")))
    if version == "v2":  # what the kernel makes in each new group: a fake cannot, so the test does
        (tmp_path / "trainer" / cgroups.GROUP).mkdir()
        (tmp_path / "trainer" / cgroups.GROUP / "cgroup.subtree_control").write_text("")
    group = cgroups.RunCgroup.create(memory_bytes=123, tasks=7)
    assert group.version == version
    if version == "v1":
        memory, pids = group.dirs
        assert memory.parent == tmp_path / "memory" / "trainer" / cgroups.GROUP
        assert (memory / "memory.limit_in_bytes").read_text() == "123" and (pids / "pids.max").read_text() == "7"
    else:
        (folder,) = group.dirs
        assert (folder / "memory.max").read_text() == "123" and (folder / "pids.max").read_text() == "7"
        assert (folder.parent / "cgroup.subtree_control").read_text() == "+memory +pids"
        assert (tmp_path / "trainer" / "cgroup.subtree_control").read_text() == "+memory +pids"
    for folder in group.dirs:  # rmdir of a real cgroup ignores its files; a fake's must go first
        for item in folder.iterdir():
            item.unlink()
    group.remove()
    assert not any(folder.exists() for folder in group.dirs)


# ---------------------------------------------------------------------------------------------- verdicts


def test_the_verdict_records_are_read_in_order_and_nothing_else_counts():
    assert parse_verdict(b'{"setup": "ok"}\n{"exit": 152}\n') == Verdict(started=True, status=152)
    assert parse_verdict(b'{"setup": "ok"}\n{"signal": 24}\n') == Verdict(started=True, status=-24)
    failed = parse_verdict(b'{"setup": "failed", "error": "could not set RLIMIT_AS"}\n{"exit": 113}\n')
    assert failed == Verdict(started=False, setup_error="could not set RLIMIT_AS", status=113)
    assert parse_verdict(b'{"setup": "ok"}\n[1]\nnot json\n{"exit": 1') == Verdict(started=True)  # cut by a kill
    assert parse_verdict(b"") == Verdict(started=False)


@pytest.mark.parametrize(
    ("bwrap", "verdict", "returncode", "killed", "expected"),
    [
        (True, Verdict(started=True, status=152), 152, False, (152, None)),
        (True, Verdict(started=True, status=-24), 152, False, (-24, None)),
        (True, Verdict(started=False, setup_error="no filter", status=113), 113, False, (113, "no filter")),
        (True, Verdict(started=False), 1, False, (1, "the boundary did not start the run")),
        (True, Verdict(started=False), 137, True, (137, None)),  # killed (timeout, flood, memory) before it started
        (True, Verdict(started=True), 137, False, (-9, "the run ended without its supervisor's report")),
        (True, Verdict(started=True), 137, True, (-9, None)),
        (False, Verdict(started=True), -24, False, (-24, None)),  # no bubblewrap: the kernel's own wait status
        (False, Verdict(started=True), 152, False, (152, None)),
    ],
)
def test_only_the_verdict_and_the_kernel_decide_the_outcome(bwrap, verdict, returncode, killed, expected):
    assert outcome(verdict, returncode, bwrap=bwrap, killed=killed) == expected
