"""The kernel boundary around a run: bubblewrap's arguments, and the launcher that prepares its mounts.

A run starts as ``unshare --mount`` (util-linux) running a short ``sh`` script, in a mount namespace of its
own that vanishes with the run:

1. it mounts one size-limited tmpfs, ``noexec,nosuid,nodev``, for every place the code may write (its folder,
   ``/tmp``, ``/dev/shm``), so nothing written there can be executed or loaded as a library, and nothing of
   it is on the host's disk; when the run ends the namespace goes, and the tmpfs with it;
2. (as root) it bind-mounts the interpreter's directories that the run's uid could not reach on the host
   (e.g. a pyenv under ``/root``) into that tmpfs, for bubblewrap to find;
3. it joins the run's cgroups (:mod:`.cgroups`), so everything started from here on is counted;
4. (as root) ``setpriv`` drops to the run's own uid, with no groups and no capabilities, and ``exec``\\ s
   ``bwrap``, which makes a new user, PID, network, IPC, UTS and cgroup namespace, a new session, dies with
   its parent, disables further user namespaces, loads the system-call filter (:mod:`.syscalls`) and starts
   the interpreter as PID 1 of the new PID namespace (the run's supervisor, :func:`.stage.supervise`) in a
   root holding only: the system's shared libraries (``/usr/lib*``, ``/lib*``) and time
   zones, read-only, the interpreter's directories (site-packages hidden unless asked for),
   ``/etc/ld.so.cache``, its own ``/proc`` and a minimal ``/dev``, and the writable tmpfs places. The rest of
   the root is read-only.

Without root the same runs inside ``unshare --user --map-root-user`` (unprivileged user namespaces), as the
user's own uid. Nothing here is the project's own namespace code: unshare, mount, setpriv and bubblewrap do it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RUN_DIR", "TOOLS", "Boundary", "RunMounts", "boundary_missing", "interpreter_layout"]

RUN_DIR = "/home/sandbox"
"""The run's folder inside the sandbox (its cwd, ``HOME`` and ``TMPDIR`` is ``/tmp``)."""
TOOLS = ("bwrap", "unshare", "setpriv", "mount", "install", "sh")
"""The programs the boundary is built with (Debian: bubblewrap, util-linux, mount, coreutils, dash)."""
SYSTEM_DIRS = (
    *("/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32", "/lib", "/lib32", "/lib64", "/libx32"),
    "/usr/share/zoneinfo",
)
"""The system's shared libraries (and time zones), shown read-only: what an interpreter and its extension
modules load. A link stays a link (``/lib -> usr/lib`` on merged-/usr systems). No programs: none could run."""
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")

_LAYOUT = """
import json, os, sys
stage = {"__name__": "lit_agentrl_sandbox_stage"}
exec(sys.argv[1], stage)
here = os.path.dirname(os.path.abspath(sys.executable))  # a venv's bin (its python links to the base one)
venv = [os.path.dirname(here)] if os.path.isfile(os.path.join(os.path.dirname(here), "pyvenv.cfg")) else []
print(json.dumps({"prefixes": sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}),
                  "executable": [os.path.realpath(sys.executable), here, *venv],
                  "path": [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)],
                  "site": sorted({os.path.realpath(p) for p in stage["site_dirs"]()}),
                  "every_site": sorted({os.path.realpath(p) for p in stage["site_dirs"](every=True)})}))
"""


def boundary_missing() -> str | None:
    """Why the boundary cannot be built here (a missing program), or None; a probe run tells the rest."""
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return (
            f"missing {', '.join(absent)} (Debian: apt-get install bubblewrap util-linux mount coreutils; "
            "bubblewrap 0.8 or newer)"
        )
    return None


@dataclass(frozen=True)
class RunMounts:
    """What the interpreter needs, read-only, and which site-packages folders to hide."""

    binds: tuple[str, ...]
    hidden: tuple[str, ...]


def _covered(path: str, tops: list[str]) -> bool:
    return any(path == top or path.startswith(top.rstrip("/") + "/") for top in tops)


@functools.cache
def interpreter_layout(python: str, site: bool) -> RunMounts:
    """The directories ``python`` runs from, found by asking it (a venv's and its base installation's)."""
    stage = Path(__file__).with_name("stage.py").read_text(encoding="utf-8")  # site_dirs, as the child finds them
    done = subprocess.run(
        [python, "-I", "-S", "-c", _LAYOUT, stage], capture_output=True, text=True, timeout=60, check=True
    )
    layout = json.loads(done.stdout)
    executable, *venv = layout["executable"]
    wanted = [*layout["prefixes"], os.path.dirname(executable), *venv, *layout["path"]]
    binds: list[str] = []
    for path in sorted(set(wanted), key=len):
        if path != "/" and not _covered(path, [*SYSTEM_DIRS, *binds]):
            binds.append(path)
    shown = set(layout["site"]) if site else set()
    hidden = tuple(p for p in layout["every_site"] if p not in shown and _covered(p, [*SYSTEM_DIRS, *binds]))
    return RunMounts(tuple(binds), hidden)


def reachable_by(uid: int, path: str) -> bool:
    """Whether ``uid`` (no groups) could open ``path`` on the host: every folder above searchable by others."""
    path = os.path.realpath(path)
    try:
        st = os.stat(path)
        if st.st_uid != uid and (st.st_mode & 0o005) != 0o005:
            return False
        parent = os.path.dirname(path)
        while parent != "/":
            st = os.stat(parent)
            if st.st_uid != uid and not st.st_mode & 0o001:
                return False
            parent = os.path.dirname(parent)
    except OSError:
        return False
    return True


_mount_point: list[str] = []


def mount_point() -> str:
    """The trainer's empty host folder over which each run mounts its tmpfs (in its own mount namespace)."""
    if not _mount_point:
        path = tempfile.mkdtemp(prefix="lit-agentrl-sandbox-mnt-")
        os.chmod(path, 0o755)
        _mount_point.append(path)
        atexit.register(_remove_mount_point, path)
    return _mount_point[0]


def _remove_mount_point(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


@dataclass(frozen=True)
class Boundary:
    """One run's launch: the ``unshare ... sh -c SCRIPT`` argv that ends in ``bwrap ... -- COMMAND``."""

    mounts: RunMounts
    uid: int | None
    """The run's own uid (root only); None: the trainer's uid, inside a user namespace of its own."""
    scratch_bytes: int
    cgroup_procs: tuple[str, ...]
    env: dict[str, str]
    code_fd: int
    seccomp_fd: int
    info_fd: int
    """Where bubblewrap writes the pid of the run's PID 1 (``--info-fd``), for the trainer to reap it if need be."""

    def argv(self, command: list[str]) -> list[str]:
        top = mount_point()
        script = [
            "set -e",
            "umask 022",  # the staged folders' modes do not depend on the trainer's umask
            f"mount -t tmpfs -o {self._tmpfs_options()} lit-agentrl-run {_q(top)}",
            f"install -d -m 0700 {self._owner()} {_q(top + '/home')} {_q(top + '/tmp')} {_q(top + '/shm')}",
        ]
        staged: dict[str, str] = {}
        for number, path in enumerate(self.mounts.binds):
            if self.uid is not None and not reachable_by(self.uid, path):
                staged[path] = f"{top}/ro/{number}"
                script.append(f"mkdir -p {_q(staged[path])} && mount --bind {_q(path)} {_q(staged[path])}")
        script += [f"echo $$ > {_q(procs)}" for procs in self.cgroup_procs]
        script.append("exec " + shlex.join([*self._drop(), *self._bwrap(top, staged), "--", *command]))
        namespaces = ["--user", "--map-root-user", "--mount"] if self.uid is None else ["--mount"]
        return ["unshare", *namespaces, "--propagation", "private", "--", "sh", "-c", "\n".join(script)]

    def _tmpfs_options(self) -> str:
        owner = 0 if self.uid is None else self.uid
        return f"size={self.scratch_bytes},nr_inodes=4096,mode=0700,uid={owner},gid={owner},noexec,nosuid,nodev"

    def _owner(self) -> str:
        return "" if self.uid is None else f"-o {self.uid} -g {self.uid}"

    def _drop(self) -> list[str]:
        if self.uid is None:
            return []
        uid = str(self.uid)
        return ["setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "--inh-caps=-all", "--"]

    def _bwrap(self, top: str, staged: dict[str, str]) -> list[str]:
        args = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        args += ["--unshare-cgroup", "--disable-userns", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        args += ["--as-pid-1", "--info-fd", str(self.info_fd)]  # the interpreter is PID 1: the run's supervisor
        if self.uid is None:
            args += ["--uid", str(os.getuid()), "--gid", str(os.getgid())]
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in SYSTEM_FILES:
            args += ["--ro-bind-try", path, path]
        args += ["--bind", f"{top}/home", RUN_DIR, "--bind", f"{top}/tmp", "/tmp"]
        for path in self.mounts.binds:  # after /tmp: an interpreter under /tmp is bound over the run's own
            args += ["--ro-bind", staged.get(path, path), path]
        for path in self.mounts.hidden:
            args += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
        args += ["--proc", "/proc", "--dev", "/dev", "--bind", f"{top}/shm", "/dev/shm", "--remount-ro", "/dev"]
        args += ["--file", str(self.code_fd), f"{RUN_DIR}/main.py", "--remount-ro", "/"]
        args += ["--seccomp", str(self.seccomp_fd), "--chdir", RUN_DIR, "--clearenv"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        return args


def _q(text: str) -> str:
    return shlex.quote(text)
