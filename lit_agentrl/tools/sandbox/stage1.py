"""Stage 1 of a sandboxed run: limits, namespaces, the run's own root, privilege drop, ``exec`` of stage 2.

The child does not import this module (it runs ``python -I -S -B`` and cannot import the project): the
parent (:mod:`lit_agentrl.tools.sandbox.runner`) reads this file's text and starts
``python -I -S -B -c LAUNCH <this text> CONFIG <rootfs's text> <stage 2's text> <the guard's text>``, where
LAUNCH compiles ``sys.argv[1]`` under the sandbox's marker file name and runs it as ``__main__``, which calls
:func:`main`. Hence: the standard library only, ASCII only (it travels in argv), and nothing done at import
but definitions, so the parent imports it too (for its constants, and for tests).

With the file-system layer (root, or a user namespace of our own), three processes: this one (the trainer's
child, outside the new namespaces) waits and exits as the code did; its child is PID 1 of the new PID
namespace, builds the run's root (:mod:`.rootfs`) and waits; its child, PID 2, drops privileges and becomes
stage 2. The code is not PID 1, whose signals the kernel treats apart; when PID 1 ends, the kernel kills
whatever the code left behind.

No model code exists in this process. Stage 2 is a fresh interpreter, so nothing used here (ctypes in
particular) is reachable from the model's code.
"""

# ruff: noqa: SIM105  (no contextlib.suppress: it would be one more import in every run)

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False  # typing is not imported in the child: it would cost every run its import time
if TYPE_CHECKING:
    from typing import Any, NoReturn

SETUP_EXIT = 113
"""Exit status of a setup failure; stderr then starts with ``SETUP_PREFIX`` and says what failed."""
SETUP_PREFIX = "lit-agentrl-sandbox setup: "

CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID = 0x40000000, 0x10000000, 0x00020000, 0x20000000
PR_SET_PDEATHSIG, PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 1, 8, 38, 47, 2
CAP_DAC_READ_SEARCH = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc: list[Any] = []


def fail(message: str) -> NoReturn:
    """End the child with a setup failure, which the parent reports as ``SandboxError: message``."""
    os.write(2, (SETUP_PREFIX + message + "\n").encode("utf-8", "replace"))
    os._exit(SETUP_EXIT)


def limit(name: str, soft: int, hard: int | None = None) -> None:
    """Set the rlimit ``name``; where the hard limit is lower than asked, as much as it allows."""
    import resource

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


def set_limits(cfg: dict[str, Any]) -> None:
    """CPU seconds (SIGKILL one second after SIGXCPU), address space, file size, no core, 256 files (the task
    limit comes last, in :func:`start_stage2`: it counts the uid's tasks, these processes among them)."""
    limit("RLIMIT_CPU", cfg["cpu"], cfg["cpu"] + 1)
    limit("RLIMIT_AS", cfg["memory"])
    limit("RLIMIT_FSIZE", cfg["fsize"])
    limit("RLIMIT_CORE", 0)
    limit("RLIMIT_NOFILE", 256)


def libc_call(name: str, *args: Any) -> None:
    """Call a libc function that returns 0 on success (ints passed as unsigned long); OSError otherwise."""
    import ctypes

    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    fn = getattr(_libc[0], name)
    if fn(*[ctypes.c_ulong(a) if isinstance(a, int) else a for a in args]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def unshare(flags: int) -> None:
    if hasattr(os, "unshare"):  # Python 3.12+
        os.unshare(flags)
    else:
        libc_call("unshare", flags)


def isolate(flags: int) -> bool:
    """Move into new namespaces (``CLONE_NEW*`` flags); False where this machine does not allow it."""
    try:
        unshare(flags)
    except Exception:
        return False
    return True


def readable_by_others(path: str) -> bool:
    """Whether a user with no relation to the file's owner can read ``path`` (a directory: list and enter it)."""
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


def needs_read_capability(site: bool) -> bool:
    """Whether an unprivileged uid must keep CAP_DAC_READ_SEARCH to load this Python's libraries."""
    needed = [p for p in sys.path if p and os.path.isdir(p)] + [sys.executable]
    if site:
        import sysconfig

        needed += [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    return not all(readable_by_others(p) for p in needed)


def keep_read_capability() -> None:
    """After ``setresuid`` with PR_SET_KEEPCAPS: keep CAP_DAC_READ_SEARCH only, also across ``exec``."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))

    class Data(ctypes.Structure):
        _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32))

    data = (Data * 2)()
    data[0].effective = data[0].permitted = data[0].inheritable = 1 << CAP_DAC_READ_SEARCH
    libc_call("capset", ctypes.byref(Header(LINUX_CAPABILITY_VERSION_3, 0)), data)
    libc_call("prctl", PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH, 0, 0)  # kept across exec
    libc_call("prctl", PR_SET_KEEPCAPS, 0, 0, 0, 0)


def drop_privileges(uid: int, keep_read: bool) -> None:
    """Become ``uid`` (as its own gid, no supplementary groups); a setup failure if that does not hold."""
    try:
        if keep_read:
            libc_call("prctl", PR_SET_KEEPCAPS, 1, 0, 0, 0)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if keep_read:
            keep_read_capability()
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError("the uid did not change")
    except Exception as exc:
        fail(f"could not drop privileges to uid {uid}: {exc}")


def harden() -> None:
    """``no_new_privs``, and SIGKILL when the trainer dies (best effort: both are Linux-only)."""
    for args in ((PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), (PR_SET_PDEATHSIG, 9, 0, 0, 0)):
        try:
            libc_call("prctl", *args)
        except Exception:
            pass


def own_user_namespace(fs: bool) -> tuple[bool, bool]:
    """Unprivileged: a user namespace of our own (our uid and gid mapped to themselves, so no capability
    survives ``exec``), with network namespace and, with ``fs``, mount and PID namespaces; what was obtained."""
    uid, gid = os.getuid(), os.getgid()
    if fs and isolate(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID):
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError as exc:
            fail(f"could not map the user namespace's ids: {exc}")
        return True, True
    return isolate(CLONE_NEWUSER | CLONE_NEWNET), False


def exit_as(status: int) -> NoReturn:
    """End this process the way a child with wait status ``status`` ended (killed by the same signal)."""
    if os.WIFSIGNALED(status):
        import signal

        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def supervise(cfg: dict[str, Any], rootfs: dict[str, Any]) -> NoReturn:
    """Outside the new PID namespace: start its PID 1, then end as the code ended (PID 1 reports that)."""
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(report_r)
        run_init(cfg, rootfs, report_w)
    os.close(report_w)
    status = os.waitpid(pid, 0)[1]
    reported = os.read(report_r, 32)
    exit_as(int(reported) if reported else status)


def run_init(cfg: dict[str, Any], rootfs: dict[str, Any], report_fd: int) -> NoReturn:
    """PID 1 of the run: build its root, start the code as PID 2, reap, report the code's wait status."""
    harden()
    try:
        rootfs["build_root"](cfg["dir"], cfg["site"], cfg["fsize"])
    except Exception as exc:
        fail(f"could not build the run's file system: {exc}")
    code_pid = os.fork()
    if code_pid == 0:
        os.close(report_fd)
        start_stage2(cfg)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == code_pid:
            break
    os.write(report_fd, str(status).encode())
    os._exit(0)


def start_stage2(cfg: dict[str, Any]) -> NoReturn:
    """Drop privileges (root), the task limit, then ``exec`` stage 2 with what was achieved in its config."""
    keep_read = False
    uid = cfg["uid"]
    if uid is not None:
        keep_read = needs_read_capability(cfg["site"])  # in the run's own root: mostly not
        drop_privileges(uid, keep_read)
    netns = cfg["netns_ok"]
    if not netns and cfg["netns"] and not keep_read and os.geteuid() != 0 and not cfg["fs_ok"]:
        # Root that could not unshare, now unprivileged: a user namespace of our own, with its network namespace.
        netns = isolate(CLONE_NEWUSER | CLONE_NEWNET)
    if cfg["nproc"] is not None:
        limit("RLIMIT_NPROC", cfg["nproc"])
    harden()
    cfg["netns_ok"], cfg["keep_read"], cfg["dropped"] = netns, keep_read, uid is not None
    try:
        argv = [sys.executable, "-I", "-S", "-B", "-c", cfg["launch"], sys.argv[4], json.dumps(cfg), *sys.argv[5:]]
        os.execv(sys.executable, argv)
    except Exception as exc:
        fail(f"could not start the interpreter: {exc}")


def load_rootfs(source: str) -> dict[str, Any]:
    """The rootfs module's functions, from its text (the child cannot import the project)."""
    namespace: dict[str, Any] = {"__name__": "lit_agentrl_sandbox_rootfs"}
    exec(compile(source, "<lit-agentrl-sandbox>", "exec"), namespace)
    return namespace


def main() -> None:
    """``sys.argv[1:]``: this text, the run's JSON config, rootfs's text, then stage 2's text and the guard's,
    which go on to stage 2 with the config updated. Ends in ``exec`` or a setup failure."""
    cfg = json.loads(sys.argv[2])
    set_limits(cfg)
    privileged = os.geteuid() == 0
    netns = bool(cfg["netns"]) and privileged and isolate(CLONE_NEWNET)
    fs = bool(cfg["fs"]) and privileged and isolate(CLONE_NEWNS | CLONE_NEWPID)
    if not privileged and (cfg["netns"] or cfg["fs"]):
        netns, fs = own_user_namespace(bool(cfg["fs"]))
    harden()
    if os.getppid() != cfg["ppid"]:
        fail("the trainer process went away")
    cfg["netns_ok"], cfg["fs_ok"] = netns, fs
    if fs:
        supervise(cfg, load_rootfs(sys.argv[3]))
    start_stage2(cfg)


if __name__ == "__main__":
    main()
