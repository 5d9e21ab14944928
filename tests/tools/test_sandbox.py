"""PythonSandbox: ordinary code runs; hostile code is contained, and comes back as an error result.

Every test here launches sandboxed interpreters. Timing assertions hold on a loaded 2-core machine: the
limits are generous where the code must finish, and a limit that must stop code is checked as "stopped, by
that limit, well before the code would have ended". (The pure helpers are tested in test_sandbox_parts.py.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import os
import signal
import socket
import time
import tracemalloc
import uuid

import pytest

from lit_agentrl.tools.sandbox import (
    CodeRunner,
    PythonSandbox,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    boundary,
    runner,
)
from lit_agentrl.tools.sandbox.runner import TOKEN_PREFIX
from lit_agentrl.tools.sandbox.stage import MARKER

pytestmark = pytest.mark.slow

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=20, output_bytes=4096)
"""One CPU second, so runaway code stops quickly; a wall limit no ordinary snippet gets near, even on a busy machine."""
SHORT_WALL = SandboxLimits(cpu_seconds=1, wall_seconds=2, output_bytes=4096)
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def sandbox(sandbox_boundary) -> PythonSandbox:
    return PythonSandbox(FAST)


def sandbox_processes() -> list[int]:
    """Pids of this test process's sandbox children still alive, orphaned grandchildren included: their command
    line carries the sandbox's marker and a run token with this process's pid (other people's runs don't)."""
    token = f"{TOKEN_PREFIX}{os.getpid()}-".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if MARKER.encode() in cmdline and token in cmdline:
                found.append(int(entry))
    return found


def no_sandbox_processes_within(seconds: float) -> bool:
    """True once no sandbox child is left (a SIGKILLed process can take a moment to go)."""
    deadline = time.monotonic() + seconds
    while sandbox_processes():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def timed(sandbox: PythonSandbox, code: str) -> tuple[SandboxResult, float]:
    start = time.monotonic()
    result = sandbox.run(code)
    return result, time.monotonic() - start


# ------------------------------------------------------------------------------------------ ordinary code


def test_prints_and_returns_stdout(sandbox):
    result = sandbox.run("x = 6 * 7\nprint(x)")
    assert result.stdout == "42\n" and result.exit_code == 0 and result.error is None
    assert not result.timed_out and not result.truncated
    assert result.as_tool_text() == "42"
    assert isinstance(sandbox, CodeRunner)


def test_no_output_says_so(sandbox):
    assert "no output" in sandbox.run("x = 1").as_tool_text()


def test_syntax_error_is_error_text(sandbox):
    result = sandbox.run("def f(:\n    pass")
    assert result.exit_code == 1 and "SyntaxError" in result.error and 'File "main.py", line 1' in result.error
    assert MARKER not in result.error  # the sandbox's own frames are not shown


def test_exception_gives_the_traceback_tail_with_stdout_first(sandbox):
    result = sandbox.run("print('partial')\ndef f():\n    return 1 / 0\nf()")
    assert result.error.splitlines()[-1] == "ZeroDivisionError: division by zero"
    assert 'File "main.py", line 3, in f' in result.error and MARKER not in result.error
    assert result.as_tool_text().startswith("partial\nTraceback")


def test_working_directory_is_private_writable_and_deleted(sandbox):
    result = sandbox.run(
        "import os, tempfile\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read())\n"
        "print(os.getcwd())\nprint(os.environ['HOME'] == os.getcwd() == tempfile.gettempdir())"
    )
    text, cwd, same = result.stdout.split()
    assert result.error is None and text == "hi" and same == "True"
    assert not os.path.exists(cwd)


def test_standard_library_imports_work_but_not_the_project(sandbox):
    result = sandbox.run("import fractions, math, itertools\nprint(fractions.Fraction(1, 3) + math.factorial(3))")
    assert result.stdout.strip() == "19/3"
    assert "No module named 'lit_agentrl'" in sandbox.run("import lit_agentrl").error


def test_bad_input_never_raises(sandbox):
    assert "must be a string" in asyncio.run(sandbox.arun(123)).error  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'/nonexistent/python' is not an executable"):
        PythonSandbox(FAST, python="/nonexistent/python")


# ----------------------------------------------------------------------------------------- hostile code


def test_infinite_loop_hits_the_cpu_limit_not_the_wall_clock(sandbox):
    result = sandbox.run("while True: pass")
    assert "TimeoutError" in result.error and "CPU time" in result.error and not result.timed_out


@pytest.mark.usefixtures("sandbox_boundary")
def test_sleeping_forever_hits_the_wall_limit():
    result, took = timed(PythonSandbox(SHORT_WALL), "import time\nprint('started')\ntime.sleep(60)")
    assert result.timed_out and "TimeoutError" in result.error and "2 seconds" in result.error
    assert result.stdout == "started\n"  # what was printed before the kill is kept
    assert took < 30, f"killed after {took:.1f}s, the code asked for 60s"
    assert no_sandbox_processes_within(5)  # the namespace's inner processes die a moment after the outer one


def test_fork_bomb_is_refused_and_leaves_no_process(sandbox):
    result = sandbox.run("import os\nwhile True: os.fork()")
    assert result.error is not None and ("os.fork" in result.error or "Resource temporarily" in result.error)
    assert not result.timed_out
    assert no_sandbox_processes_within(5)


def test_huge_allocation_is_a_memory_error(sandbox):
    result = sandbox.run("x = bytearray(10**10)")
    assert result.error.splitlines()[-1] == "MemoryError"


def test_big_output_is_truncated_without_trainer_memory(sandbox):
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    try:
        result = sandbox.run("print('x' * 100_000)\nprint('done')")
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()
    assert result.error is None and result.truncated and not result.timed_out  # the pipe never blocked it
    assert result.stdout.startswith("x" * FAST.output_bytes)
    assert len(result.stdout) < FAST.output_bytes + 200 and "output truncated" in result.stdout
    assert peak < 2 * 2**20, f"the trainer kept {peak} bytes for 100 kB of output"


def test_an_output_flood_is_stopped(sandbox):
    """Past FLOOD_FACTOR x output_bytes the parent stops reading and kills the run: its own CPU stays bounded."""
    result = sandbox.run("import sys\nwhile True: sys.stdout.write('x' * 65536)")
    assert result.error.startswith("OutputError") and result.truncated and not result.timed_out
    assert result.stdout.startswith("x" * FAST.output_bytes) and len(result.stdout) < FAST.output_bytes + 200


def test_project_files_are_unreadable(sandbox):
    project_file = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "pyproject.toml")
    result = sandbox.run(f"print(open({project_file!r}).read())")
    assert "PermissionError" in result.error and "[build-system]" not in result.stdout
    assert "PermissionError" in sandbox.run("import os\nprint(os.listdir('/'))").error


def test_environment_has_no_secrets(sandbox, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret123")
    result = sandbox.run("import os\nprint(dict(os.environ))")
    assert result.error is None and "secret123" not in result.stdout and "WANDB" not in result.stdout
    assert "/work" not in result.stdout
    # Nor through /proc: the trainer's environment file is refused.
    parent_env = sandbox.run("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())")
    assert "PermissionError" in parent_env.error and "secret123" not in parent_env.stdout


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
        "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()",
    ],
    ids=["connect", "listen"],
)
def test_sockets_are_refused(sandbox, code):
    result = sandbox.run(code)
    assert "PermissionError: sandbox: network access" in result.error


def test_writing_outside_its_directory_is_refused(sandbox):
    target = f"/tmp/escape-{uuid.uuid4().hex}.txt"
    result = sandbox.run(f"open({target!r}, 'w').write('x')")
    assert "PermissionError" in result.error and not os.path.exists(target)
    result = sandbox.run(f"import os\nos.rename('main.py', {target!r})")
    assert "PermissionError" in result.error and not os.path.exists(target)


def test_killing_its_parent_is_refused(sandbox):
    result = sandbox.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert "PermissionError" in result.error
    os.kill(os.getpid(), 0)  # still here


def test_running_programs_is_refused(sandbox):
    result = sandbox.run("import subprocess\nsubprocess.run(['ls'])")
    assert "PermissionError" in result.error and "starting programs" in result.error
    assert "PermissionError" in sandbox.run("import os\nos.system('ls')").error
    assert "ImportError" in sandbox.run("import ctypes").error


# ------------------------------------------------------------------------ the boundary, and its absence


def test_kernel_layers_hold_without_the_audit_hook(sandbox):
    """With the audit hook switched off, the namespaces, the uid, seccomp and the task limit still hold."""
    if not sandbox.strong:
        pytest.skip(f"this machine lacks part of the boundary: {sandbox.isolation['missing']}")
    bare = PythonSandbox(FAST)
    bare._guard = False
    fork = bare.run("import os\nwhile True: os.fork()")
    assert "BlockingIOError" in fork.error and no_sandbox_processes_within(5)
    killed = bare.run("import os, signal\nos.kill(1, signal.SIGKILL)\nos.kill(os.getppid(), signal.SIGKILL)")
    assert killed.error is None or "Operation not permitted" in killed.error or "No such process" in killed.error
    os.kill(os.getpid(), 0)  # still here
    target = os.path.join(os.path.dirname(__file__), f"escape-{uuid.uuid4().hex}.txt")
    written = bare.run(f"open({target!r}, 'w')").error  # in its own root the folder doesn't even exist
    assert ("Read-only" in written or "No such file" in written) and not os.path.exists(target)
    with socket.create_server(("127.0.0.1", 0)) as listening:  # the machine's loopback is not the run's
        port = listening.getsockname()[1]
        connect = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
        assert "Connection refused" in bare.run(connect).error
    assert "unreachable" in bare.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)").error
    assert "Operation not permitted" in bare.run("import os\nos.execv('/usr/bin/true', ['true'])").error


@pytest.mark.parametrize("max_processes", [0, 2])
def test_the_pids_cgroup_alone_holds_the_task_limit(sandbox, monkeypatch, max_processes):
    """Without RLIMIT_NPROC (which counts per uid, so only a uid of the run's own makes it exact), the run's cgroup
    still allows exactly max_processes more tasks."""
    if not sandbox.strong:
        pytest.skip(f"this machine lacks part of the boundary: {sandbox.isolation['missing']}")
    bare = PythonSandbox(dataclasses.replace(FAST, max_processes=max_processes))
    bare._guard = False
    monkeypatch.setattr(bare, "_task_limit", lambda uid, bwrap: None)
    code = "import os, time\nn = 0\ntry:\n    for _ in range(10):\n        if os.fork() == 0:\n"
    code += "            time.sleep(2)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)"
    result = bare.run(code)
    assert result.stdout.strip() == str(max_processes), result
    assert no_sandbox_processes_within(5)


def test_isolation_report(sandbox):
    iso = sandbox.isolation
    assert set(iso) == {"boundary", "seccomp", "cgroup", "uid_drop", "missing"}
    assert sandbox.strong == (not iso["missing"])
    if sandbox.strong:
        assert iso["boundary"] == "bubblewrap" and iso["seccomp"] and iso["cgroup"] in ("v1", "v2")
    if ROOT and iso["uid_drop"]:  # each run gets an unprivileged uid of its own
        uids = {int(sandbox.run("import os\nprint(os.getuid())").stdout) for _ in range(2)}
        assert len(uids) == 2 and 0 not in uids


def test_a_missing_boundary_is_refused_unless_weak_isolation_is_accepted(monkeypatch):
    """No silent fallback: without bubblewrap the sandbox is not built, naming what is missing; accepted, it runs
    with the rest (seccomp, cgroup, the audit hook) and says what is missing."""
    monkeypatch.setattr(runner, "_probe_cache", {})
    monkeypatch.setattr(runner, "boundary_missing", lambda: "missing bwrap (Debian: apt-get install bubblewrap)")
    with pytest.raises(SandboxUnavailable, match=r"missing bwrap.*allow_weak_sandbox=True"):
        PythonSandbox(FAST)
    weak = PythonSandbox(FAST, allow_weak_sandbox=True)
    assert weak.isolation["boundary"] is None and not weak.strong
    assert weak.run("print(6 * 7)").stdout == "42\n"
    assert "PermissionError" in weak.run("open('/etc/hostname').read()").error  # the hook still refuses
    if weak.isolation["seccomp"]:
        weak._guard = False
        assert "Operation not permitted" in weak.run("import os\nos.memfd_create('x')").error
    if weak.isolation["cgroup"]:  # without bubblewrap the run is its interpreter alone: no task to spare
        weak._guard = False
        fork = "import os\ntry:\n    if os.fork() == 0:\n        os._exit(0)\n    print('forked')\nexcept OSError:\n    print('refused')"
        assert weak.run(fork).stdout == "refused\n"


def test_a_run_leaves_nothing_on_the_host(sandbox):
    """Its files were in its own tmpfs, its processes in its own namespace, its limits in its own cgroup."""
    if not sandbox.strong:
        pytest.skip(f"this machine lacks part of the boundary: {sandbox.isolation['missing']}")

    def left() -> list[str]:  # what this run could have left (the machine's /tmp is shared with other processes)
        names = [f"/tmp/{n}" for n in os.listdir("/tmp") if n == "left" or n.startswith("lit-agentrl-sandbox-")]
        return sorted(n for n in names if "-mnt-" not in n) + [n for n in os.listdir("/dev/shm") if n == "left"]

    before = left()
    code = "import os\nfor _ in range(1200):\n    os.mkdir('d'); os.chdir('d')\nopen('f', 'w').write('x' * 10**6)\n"
    code += "open('/tmp/left', 'w').write('x'); open('/dev/shm/left', 'w').write('x')\nprint(os.getcwd().count('/'))"
    bare = PythonSandbox(FAST)
    bare._guard = False
    result = bare.run(code)
    assert result.error is None and int(result.stdout) > 1200, result.error
    assert left() == before
    assert os.listdir(boundary.mount_point()) == []
    assert not glob.glob(f"/sys/fs/cgroup/*/**/lit-agentrl-sandbox/run-{os.getpid()}-*", recursive=True)
    assert no_sandbox_processes_within(5)


# ---------------------------------------------------------------------------------------------- asyncio


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most of these (start, end) intervals that were open at one instant."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_arun_runs_concurrently_without_blocking_the_loop(sandbox):
    # 4 s each: on a loaded 2-core machine, starting 8 sandboxes (two interpreters each) can take a few seconds
    snippet = "import time\nstart = time.time()\ntime.sleep(4)\nprint({}, start, time.time())"

    async def main():
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker():
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        results = await asyncio.gather(*(sandbox.arun(snippet.format(i)) for i in range(8)))
        done.set()
        await tick
        # Called from inside a running loop, the blocking API still works (on a loop of its own).
        nested = sandbox.run("print('nested')")
        return results, max(gaps), nested

    results, worst_gap, nested = asyncio.run(main())
    printed = [r.stdout.split() for r in results]
    assert [p[0] for p in printed] == [str(i) for i in range(8)], [r.error for r in results]
    # Serial runs would never overlap; these start within a few seconds of each other even on a busy machine.
    overlap = max_overlap([(float(p[1]), float(p[2])) for p in printed])
    assert overlap >= 4, f"at most {overlap} of 8 sleeping snippets ran at once"
    assert worst_gap < 2.0, f"the event loop was blocked for {worst_gap:.2f}s (a blocking run: 4s or more)"
    assert nested.stdout == "nested\n"


def test_cancelling_arun_kills_the_child(sandbox):
    async def main():
        task = asyncio.create_task(sandbox.arun("import time\ntime.sleep(30)"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert no_sandbox_processes_within(5)


@pytest.mark.usefixtures("sandbox_boundary")
def test_site_packages_option_gives_sympy_but_not_the_project():
    pytest.importorskip("sympy")
    sandbox = PythonSandbox(SandboxLimits(cpu_seconds=20, wall_seconds=60), site_packages=True)
    result = sandbox.run("import sympy\nprint(sympy.sqrt(8))")
    assert result.stdout.strip() == "2*sqrt(2)", result.error
    assert "No module named 'lit_agentrl'" in sandbox.run("import lit_agentrl").error
    assert "PermissionError" in sandbox.run("import ctypes\nctypes.CDLL('libc.so.6').getpid()").error


def test_signals_are_named_in_errors(sandbox):
    result = sandbox.run("import os, signal\nsignal.raise_signal(signal.SIGSEGV)")
    assert result.exit_code == -signal.SIGSEGV and "SIGSEGV" in result.error


def _zombie_children() -> list[int]:
    """This process's children that have ended and not been waited for."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found.append(int(entry))
    return found


@pytest.mark.usefixtures("sandbox_boundary")
def test_a_weak_run_reports_the_codes_own_status_and_reaps_what_it_forked(monkeypatch):
    """Without bubblewrap the code's interpreter is the trainer's own child (its wait status is the kernel's), and
    a daemonised grandchild, killed at the end of the run, is left to the trainer (a subreaper) and reaped."""
    monkeypatch.setattr(runner, "_probe_cache", {})
    monkeypatch.setattr(runner, "boundary_missing", lambda: "missing bwrap (Debian: apt-get install bubblewrap)")
    weak = PythonSandbox(dataclasses.replace(FAST, max_processes=4), allow_weak_sandbox=True)
    weak._guard = False
    result = weak.run("import os, sys\nsys.stderr.write('lit-agentrl-sandbox setup: forged\\n')\nos._exit(152)")
    assert result.exit_code == 152 and result.error == "lit-agentrl-sandbox setup: forged"
    before = set(_zombie_children())
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n"
    code += "    os._exit(0)\nos.wait()\nprint('parent done')"
    assert weak.run(code).stdout == "parent done\n"
    assert no_sandbox_processes_within(5) and set(_zombie_children()) <= before


def test_a_boundary_that_cannot_be_built_is_a_sandbox_error_naming_why(sandbox, monkeypatch):
    layout = boundary.interpreter_layout(sandbox.python, sandbox.site_packages)
    missing = f"/nonexistent-{uuid.uuid4().hex}"
    monkeypatch.setattr(runner, "interpreter_layout", lambda *_: boundary.RunMounts((*layout.binds, missing), ()))
    result = sandbox.run("print(1)")
    assert (
        result.error.startswith("SandboxError: the boundary did not start the run (exit status ")
        and result.stdout == ""
    )
    assert missing in result.error  # the launcher's own message (mount's or bubblewrap's)
