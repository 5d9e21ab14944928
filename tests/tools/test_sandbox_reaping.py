"""The trainer as PID 1 of its own PID namespace (a container without an init, ``docker run python train.py``).

Whatever a run leaves to the trainer (bubblewrap's PID 1 when a run is killed) must be reaped, or it stays a
zombie for good; and the trainer's own children (``subprocess``, asyncio subprocesses, ``multiprocessing``) must
keep their exit statuses for whoever waits for them. A Python process started as PID 1 of a fresh PID namespace
(util-linux's ``unshare --pid --fork --mount-proc``, which needs root) builds sandboxes and runs ordinary, failing,
timed-out, flooding and CPU-bound code, in each mode (with the audit hook, without it, with site-packages),
while children of its own end; then it counts the zombies in its namespace and reports its children's statuses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from lit_agentrl.tools.sandbox import reaping

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("sandbox_boundary")]

TRAINER = r"""
import asyncio, json, multiprocessing, os, subprocess, sys
from lit_agentrl.tools.sandbox import PythonSandbox, SandboxLimits

assert os.getpid() == 1, os.getpid()
limits = SandboxLimits(cpu_seconds=1, wall_seconds=3, output_bytes=1024)
worker = multiprocessing.get_context("fork").Process(target=os._exit, args=(3,))
worker.start()  # ends at once: a zombie until joined, which a greedy reaper would take
popen = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(7)"], stdin=subprocess.PIPE)
CODES = ["print(1)", "raise SystemExit(152)", "import time\ntime.sleep(60)", "while True: print('x' * 9999)",
         "while True: pass", "import os\nos.kill(1, 9)\nprint('after')"]

async def runs():
    errors = []
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", "import sys; sys.exit(5)")
    for site, hook in [(False, True), (False, False), (True, True)]:
        sandbox = PythonSandbox(limits, site_packages=site)
        sandbox._guard = hook
        for code in CODES:
            errors.append((await sandbox.arun(code)).error)
            if popen.stdin is not None and not popen.stdin.closed:
                popen.stdin.close()  # it ends while the next runs go on
    return errors, await asyncio.wait_for(child.wait(), 60)

errors, asyncio_status = asyncio.run(runs())
worker.join(60)
statuses = {"multiprocessing": worker.exitcode, "subprocess": popen.wait(60), "asyncio": asyncio_status}
zombies = []
for entry in filter(str.isdigit, os.listdir("/proc")):
    with open(f"/proc/{entry}/stat") as f:
        stat = f.read()
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        zombies.append(stat[:80])
print(json.dumps({"zombies": zombies, "errors": errors, **statuses}))
"""


def test_the_trainer_as_pid_1_is_left_no_zombie_and_keeps_its_childrens_statuses():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("making a PID namespace with util-linux's unshare needs root")
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", TRAINER],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    errors = report["errors"]
    assert len(errors) == 18 and errors[0::6] == [None] * 3, errors  # every run ran, in each mode
    assert all(e.startswith("TimeoutError: the code did not finish") for e in errors[2::6]), errors
    assert all(e.startswith("OutputError") for e in errors[3::6]), errors
    assert report["zombies"] == [], report
    assert (report["multiprocessing"], report["subprocess"], report["asyncio"]) == (3, 7, 5), report


def test_a_pinned_process_is_reaped_only_once_it_is_ours():
    """A child of a child: pinned, it is waited for only after it has become this process's (by subreaping)."""
    reaping.become_subreaper()
    spawn = "import subprocess, sys\nprint(subprocess.Popen(['sleep', '60']).pid, flush=True)\nsys.stdin.read()"
    middle = subprocess.Popen(
        [sys.executable, "-c", spawn],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    grandchild = int(middle.stdout.readline())
    orphans = reaping.Orphans()
    assert orphans.pin(grandchild, lambda pid: True) is not None
    orphans.reap(0)
    assert len(orphans) == 1  # alive, and not ours yet
    middle.stdin.close()
    assert middle.wait(60) == 0  # its parent's status is its parent's
    os.kill(grandchild, 9)
    orphans.reap(60)
    assert len(orphans) == 0
    with pytest.raises(ChildProcessError):  # reaped: by the pinned pidfd, not left as a zombie
        os.waitpid(grandchild, os.WNOHANG)
