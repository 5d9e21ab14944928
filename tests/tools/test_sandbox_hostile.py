"""Hostile snippets against the sandbox's file-system boundary: each must leave the canaries unread and unchanged.

The canaries, outside any run's folder: a root-only file (mode 0600) in a folder of this test's, a project
checkout (world-readable, with a file whose name is a secret too), a file in ``/dev/shm``, and a world-writable
folder holding a world-writable file. After each snippet: no secret in its output, every canary as it was, and
nothing new in the world-writable folders (the snippets name what they try to create after ``PWN``).

Beside the files, objects of the machine's other kinds: a key in this process's session keyring, a System V
shared-memory segment and message queue and a POSIX message queue holding the secret; after each snippet none
may be read, changed or added to (no new keys for any uid, no new IPC objects), and a snippet that gets past a
limit or runs native code of its own prints ``ESCAPED`` (checked too).

Every snippet runs twice: with the audit hook, and without it (bubblewrap's namespaces, the seccomp filter and
the cgroup alone must hold; where this machine lacks any of them the second half is skipped, or fails where
``LIT_AGENTRL_REQUIRE_SANDBOX=1``, as in CI). The snippets use no interpreter bug; they try to get around the
hook (file descriptors relative to a directory, ``/proc/self/fd`` and ``/proc/self/root``, ``chdir``, links) or
to disarm it from inside (frames, tracebacks, closures, defaults, ``gc``, module and builtin patching), and
with native code (an extension module or library written to a writable place, raw system calls through
ctypes: ``execve``, keyrings, IPC, ``memfd``, ``fallocate``, ``open_by_handle_at``) past anything the hook sees.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import glob
import os
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from lit_agentrl.tools.sandbox import PythonSandbox, SandboxLimits, boundary
from lit_agentrl.tools.sandbox.syscalls import seccomp_missing

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("sandbox_boundary")]

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=30, output_bytes=8192)
REPO = Path(__file__).resolve().parents[2]
TOKEN = uuid.uuid4().hex
SECRET = f"canary-secret-{TOKEN}"
LISTING = f"canary-name-{TOKEN}.txt"
PWN = f"PWN{TOKEN}"
ESCAPED = f"ESCAPED{TOKEN}"
KEY_NAME = f"lit-agentrl-canary-{TOKEN}"
IPC_KEY = 0x5A000000 | (int(TOKEN[:6], 16) & 0xFFFFFF)
MQ_NAME = f"/lit-agentrl-canary-{TOKEN}"

PRELUDE = '''\
import os, sys
def escaped(what):
    print(ESCAPED, what)
def attempt(f):
    try:
        print("GOT", repr(f())[:300])
    except BaseException as e:
        print("NO", type(e).__name__, str(e)[:200])
def read(path, **kw):
    with open(path, **kw) as f:
        return f.read()
def fd_read(fd):
    return os.read(fd, 4096)
def disarm_from(frames):
    """Replace the code and defaults of every function reachable from these frames, mutate every mapping."""
    noop = (lambda *a, **k: None).__code__
    seen, done = set(), 0
    frames = [fr for fr in frames if fr.f_code.co_filename != "main.py"]  # not this snippet's own
    todo = [v for fr in frames for v in list(fr.f_locals.values()) + list(fr.f_globals.values())]
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if callable(getattr(v, "__self__", None)) or hasattr(getattr(v, "__self__", None), "keys"):
            todo.append(v.__self__)
        if hasattr(v, "__code__"):
            for cell in getattr(v, "__closure__", None) or ():
                try:
                    todo.append(cell.cell_contents)
                    cell.cell_contents = None
                    done += 1
                except Exception:
                    pass
            todo += list(getattr(v, "__defaults__", None) or ())
            for name, value in (("__code__", noop), ("__defaults__", None)):
                try:
                    setattr(v, name, value)
                    done += 1
                except Exception:
                    pass
        if hasattr(v, "keys"):
            try:
                todo += list(v.values())
                for key in list(v.keys()):
                    v[key] = None
                    done += 1
            except Exception:
                pass
    return done
def refusal_frames():
    try:
        open(SECRET)
    except BaseException as e:
        tb, frames = e.__traceback__, []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        f = frames[-1]
        while f is not None:
            frames.append(f)
            f = f.f_back
        return [fr for fr in frames if fr.f_code.co_filename != "main.py"]  # the hook's and the sandbox's
    return []
'''

NATIVE = """  # loads an extension module (and the library, by ctypes) copied to NATIVE_FROM
def go():
    import importlib.util, shutil
    for name in ("_bisect", "_random", "array", "_json", "math", "select", "_struct"):
        spec = importlib.util.find_spec(name)
        if spec and spec.origin and spec.origin.endswith(".so") and name not in sys.modules:
            break
    else:
        return "no extension module on disk to copy"
    copy = os.path.join(NATIVE_FROM, os.path.basename(spec.origin))
    with open(spec.origin, "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    os.chmod(copy, 0o755)
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, copy))
    escaped("loaded native code from " + NATIVE_FROM)
    return module
attempt(go)
def by_ctypes():
    import ctypes
    for entry in os.listdir(NATIVE_FROM):
        if entry.endswith(".so"):
            ctypes.CDLL(os.path.join(NATIVE_FROM, entry))
            escaped("dlopen from " + NATIVE_FROM)
attempt(by_ctypes)
"""


SNIPPETS = {
    # ---- file descriptors relative to a directory, and the *at-style calls
    "dir_fd_read_after_chdir": """
os.mkdir("sub"); top = os.open(".", os.O_RDONLY | os.O_DIRECTORY); os.chdir("sub")
attempt(lambda: fd_read(os.open(os.path.relpath(SECRET, WORK), os.O_RDONLY, dir_fd=top)))
attempt(lambda: fd_read(os.open(os.path.relpath(CHECKOUT + "/pyproject.toml", WORK), os.O_RDONLY, dir_fd=top)))
""",
    "dir_fd_write_after_chdir": """
os.mkdir("sub"); top = os.open(".", os.O_RDONLY | os.O_DIRECTORY); os.chdir("sub")
attempt(lambda: os.write(os.open(os.path.relpath(PUBLIC + "/" + PWN, WORK), os.O_WRONLY | os.O_CREAT, 0o666, dir_fd=top), b"x"))
attempt(lambda: os.write(os.open(os.path.relpath(PUBCANARY, WORK), os.O_WRONLY | os.O_APPEND, dir_fd=top), b"x"))
""",
    "dir_fd_from_root": """
root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
attempt(lambda: fd_read(os.open(SECRET.lstrip("/"), os.O_RDONLY, dir_fd=root)))
attempt(lambda: os.listdir(root))
""",
    "dir_fd_from_parent": """
up = os.open("..", os.O_RDONLY | os.O_DIRECTORY)
attempt(lambda: os.listdir(up))
attempt(lambda: fd_read(os.open(os.path.relpath(SECRET, os.path.dirname(WORK)), os.O_RDONLY, dir_fd=up)))
""",
    "o_directory_listing_checkout": """
fd = os.open(CHECKOUT, os.O_RDONLY | os.O_DIRECTORY)
attempt(lambda: os.listdir(fd))
attempt(lambda: [e.name for e in os.scandir(fd)])
""",
    "o_directory_listing_shm": """
attempt(lambda: os.listdir(os.open("/dev/shm", os.O_RDONLY | os.O_DIRECTORY)))
attempt(lambda: fd_read(os.open(os.path.basename(SHM), os.O_RDONLY, dir_fd=os.open("/dev/shm", os.O_RDONLY))))
""",
    "posix_module_at_calls": """
import posix
fd = posix.open(os.path.dirname(SECRET), posix.O_RDONLY | posix.O_DIRECTORY)
attempt(lambda: posix.read(posix.open(os.path.basename(SECRET), posix.O_RDONLY, dir_fd=fd), 4096))
attempt(lambda: posix.listdir(fd))
""",
    "mkdir_rename_unlink_at": """
pub = os.open(PUBLIC, os.O_RDONLY | os.O_DIRECTORY)
attempt(lambda: os.mkdir(PWN, dir_fd=pub))
attempt(lambda: os.rename("main.py", PWN, dst_dir_fd=pub))
attempt(lambda: os.unlink(os.path.basename(PUBCANARY), dir_fd=pub))
attempt(lambda: os.utime(os.path.basename(PUBCANARY), (0, 0), dir_fd=pub))
""",
    "chmod_chown_at": """
pub = os.open(PUBLIC, os.O_RDONLY | os.O_DIRECTORY)
attempt(lambda: os.chmod(os.path.basename(PUBCANARY), 0o600, dir_fd=pub))
attempt(lambda: os.chown(os.path.basename(PUBCANARY), 0, 0, dir_fd=pub))
attempt(lambda: os.chmod(PUBCANARY, 0o600))
""",
    "fwalk_checkout": """
attempt(lambda: [(d, f) for _, d, f, _ in os.fwalk(CHECKOUT)])
attempt(lambda: [(d, f) for _, d, f in os.walk(CHECKOUT)])
""",
    "fchdir_to_root": """
attempt(lambda: os.fchdir(os.open("/", os.O_RDONLY | os.O_DIRECTORY)))
attempt(lambda: read(SECRET.lstrip("/")))
attempt(lambda: os.listdir(CHECKOUT.lstrip("/")))
""",
    "o_path_reopen": """
p = os.open(SECRET, os.O_PATH)
attempt(lambda: read(f"/proc/self/fd/{p}"))
attempt(lambda: fd_read(os.open(f"/proc/self/fd/{p}", os.O_RDONLY)))
""",
    # ---- /proc paths
    "proc_self_fd_dir": """
top = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
attempt(lambda: read(f"/proc/self/fd/{top}/" + os.path.relpath(SECRET, WORK)))
attempt(lambda: os.listdir(f"/proc/self/fd/{top}/.."))
""",
    "proc_self_fd_write": """
top = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
attempt(lambda: open(f"/proc/self/fd/{top}/" + os.path.relpath(PUBLIC + "/" + PWN, WORK), "w").write("x"))
attempt(lambda: open(f"/proc/self/fd/{top}/" + os.path.relpath(PUBCANARY, WORK), "a").write("x"))
""",
    "proc_self_root": """
attempt(lambda: read("/proc/self/root" + SECRET))
attempt(lambda: os.listdir("/proc/self/root" + CHECKOUT))
attempt(lambda: open("/proc/self/root" + PUBLIC + "/" + PWN, "w").write("x"))
""",
    "proc_self_cwd": """
attempt(lambda: read("/proc/self/cwd/" + os.path.relpath(SECRET, WORK)))
attempt(lambda: os.listdir("/proc/self/cwd/" + os.path.relpath(CHECKOUT, WORK)))
""",
    "proc_other_roots": """
for pid in ("1", "2", str(os.getppid()), "thread-self/.."):
    attempt(lambda: read(f"/proc/{pid}/root" + SECRET))
    attempt(lambda: read(f"/proc/{pid}/environ"))
""",
    "proc_listing": """
attempt(lambda: os.listdir("/proc/1/root" + CHECKOUT))
attempt(lambda: os.listdir("/proc/1/cwd"))
attempt(lambda: read("/proc/1/root" + SHM))
""",
    # ---- plain paths, other openers
    "plain_reads": """
for path in (SECRET, CHECKOUT + "/pyproject.toml", CHECKOUT + "/" + LISTING_DIR_FILE, SHM, REPO_FILE):
    attempt(lambda: read(path))
attempt(lambda: os.listdir(CHECKOUT))
attempt(lambda: os.listdir(os.path.dirname(REPO_FILE)))
""",
    "plain_writes": """
for path in (PUBLIC + "/" + PWN, "/dev/shm/" + PWN, "/tmp/" + PWN, CHECKOUT + "/" + PWN):
    attempt(lambda: open(path, "w").write("x"))
for path in (PUBCANARY, SHM, SECRET):
    attempt(lambda: open(path, "a").write("x"))
""",
    "io_open_code": """
import io
attempt(lambda: io.open_code(SECRET).read())
attempt(lambda: io.open_code(CHECKOUT + "/pyproject.toml").read())
""",
    "fileio_and_underscore_io": """
import io, _io
attempt(lambda: io.FileIO(SECRET).read())
attempt(lambda: _io.open(SHM).read())
attempt(lambda: _io.FileIO(PUBLIC + "/" + PWN, "w").write(b"x"))
""",
    "posix_open_direct": """
import posix
attempt(lambda: posix.read(posix.open(SECRET, posix.O_RDONLY), 4096))
attempt(lambda: posix.write(posix.open(PUBCANARY, posix.O_WRONLY | posix.O_TRUNC), b""))
""",
    "truncate_and_utime": """
attempt(lambda: os.truncate(PUBCANARY, 0))
attempt(lambda: os.truncate(os.open(PUBCANARY, os.O_WRONLY), 0))
attempt(lambda: os.utime(SHM, (0, 0)))
""",
    "rename_and_remove": """
attempt(lambda: os.rename(PUBCANARY, "stolen"))
attempt(lambda: os.replace("main.py", PUBCANARY))
attempt(lambda: os.remove(SHM))
attempt(lambda: os.rmdir(CHECKOUT))
""",
    "shutil_and_tempfile": """
import shutil, tempfile
attempt(lambda: shutil.copy(SECRET, "copy.txt") and read("copy.txt"))
attempt(lambda: shutil.copytree(CHECKOUT, "tree") and os.listdir("tree"))
attempt(lambda: tempfile.mkstemp(prefix=PWN, dir="/tmp"))
attempt(lambda: tempfile.mkstemp(prefix=PWN, dir=PUBLIC))
""",
    "sqlite_outside": """
import sqlite3
attempt(lambda: sqlite3.connect(PUBLIC + "/" + PWN + ".db").execute("create table t(x)"))
attempt(lambda: sqlite3.connect("file:" + SECRET + "?mode=ro", uri=True).execute("select 1").fetchall())
""",
    "glob_and_pathlib": """
import glob, pathlib
attempt(lambda: glob.glob(CHECKOUT + "/*"))
attempt(lambda: [p.name for p in pathlib.Path(CHECKOUT).iterdir()])
attempt(lambda: pathlib.Path(SECRET).read_text())
""",
    # ---- symbolic and hard links, races
    "symlink_to_secret": """
attempt(lambda: os.symlink(SECRET, "link"))
attempt(lambda: read("link"))
attempt(lambda: os.symlink(PUBLIC, "pub") or open("pub/" + PWN, "w").write("x"))
""",
    "hardlink_to_canary": """
attempt(lambda: os.link(SECRET, "hard"))
attempt(lambda: os.link(PUBCANARY, "hard2") or open("hard2", "a").write("x"))
attempt(lambda: read("hard"))
""",
    "symlink_swap_race": """
open("inside.txt", "w").write("fine")
for _ in range(50):
    attempt(lambda: os.symlink(SECRET, "swap.tmp") or os.replace("swap.tmp", "inside.txt"))
    attempt(lambda: read("inside.txt"))
""",
    "dir_swap_race": """
os.mkdir("d"); open("d/" + os.path.basename(SECRET), "w").write("fine")
for _ in range(20):
    attempt(lambda: os.rename("d", "d.old") or os.symlink(os.path.dirname(SECRET), "d"))
    attempt(lambda: read("d/" + os.path.basename(SECRET)))
""",
    "fspath_toctou": """
class Flip:
    n = 0
    def __fspath__(self):
        Flip.n += 1
        return "main.py" if Flip.n % 2 else SECRET
for _ in range(4):
    attempt(lambda: read(Flip()))
""",
    "str_subclass_path": """
class Sly(str):
    def startswith(self, *a): return True
    def split(self, *a): return ["", "tmp"]
attempt(lambda: read(Sly(SECRET)))
attempt(lambda: open(Sly(PUBLIC + "/" + PWN), "w").write("x"))
""",
    # ---- chdir tricks
    "chdir_up_and_read": """
for _ in range(8):
    attempt(lambda: os.chdir(".."))
attempt(lambda: read(os.path.relpath(SECRET)))
attempt(lambda: read(SECRET.lstrip("/")))
""",
    "chdir_root_and_list": """
attempt(lambda: os.chdir("/"))
attempt(lambda: os.listdir("."))
attempt(lambda: os.chdir(os.path.dirname(SECRET)))
attempt(lambda: read(os.path.basename(SECRET)))
""",
    "chdir_proc_cwd": """
attempt(lambda: os.chdir("/proc/self/root" + os.path.dirname(SECRET)))
attempt(lambda: read(os.path.basename(SECRET)))
attempt(lambda: os.chdir("/proc/1/cwd/.."))
attempt(lambda: os.listdir("."))
""",
    # ---- disarming the hook from inside
    "traceback_frame_locals": """
frames = refusal_frames()
print("frames", len(frames), disarm_from(frames))
attempt(lambda: read(SECRET))
attempt(lambda: read(CHECKOUT + "/pyproject.toml"))
attempt(lambda: open(PUBLIC + "/" + PWN, "w").write("x"))
""",
    "closure_cells": """
frames = refusal_frames()
for fr in frames:
    for v in fr.f_locals.values():
        for cell in getattr(v, "__closure__", None) or ():
            attempt(lambda: setattr(cell, "cell_contents", ("/",)))
attempt(lambda: read(SHM))
attempt(lambda: os.listdir(CHECKOUT))
""",
    "defaults_and_code": """
frames = refusal_frames()
for fr in frames:
    for v in fr.f_locals.values():
        if hasattr(v, "__defaults__"):
            attempt(lambda: setattr(v, "__defaults__", tuple(("/",) for _ in v.__defaults__ or ())))
            attempt(lambda: setattr(v, "__code__", (lambda *a: None).__code__))
            attempt(lambda: delattr(v, "__defaults__"))
attempt(lambda: read(SECRET))
""",
    "mapping_proxies": """
import types
frames = refusal_frames()
for fr in frames:
    for v in fr.f_locals.values():
        target = getattr(v, "__self__", v)
        if isinstance(target, (dict, types.MappingProxyType)) and target is not globals():
            attempt(lambda: target.__setitem__("open", lambda *a: None))
            attempt(lambda: dict.clear(target))
attempt(lambda: read(SECRET))
""",
    "getframe_in_fspath": """
import sys
grabbed = []
class Spy:
    def __fspath__(self):
        f = sys._getframe(1)
        while f is not None:
            grabbed.append(f)
            f = f.f_back
        return "main.py"
read(Spy())
print("grabbed", len(grabbed), disarm_from(grabbed))
attempt(lambda: read(SECRET))
attempt(lambda: os.listdir(CHECKOUT))
""",
    "generator_and_exc_info_frames": """
import sys
def gen():
    yield open(SECRET)
g = gen()
attempt(lambda: next(g))
attempt(lambda: disarm_from([g.gi_frame] if g.gi_frame else []))
try:
    os.kill(os.getppid(), 0)
except BaseException:
    tb = sys.exc_info()[2]
    while tb:
        attempt(lambda: disarm_from([tb.tb_frame]))
        tb = tb.tb_next
attempt(lambda: read(SECRET))
""",
    "gc_introspection": """
import gc
attempt(lambda: len(gc.get_objects()))
attempt(lambda: gc.get_referrers(PermissionError))
attempt(lambda: gc.get_referents(sys.modules))
attempt(lambda: gc.freeze())
attempt(lambda: read(SECRET))
""",
    "sys_modules_and_main": """
main = sys.modules["__main__"]
attempt(lambda: disarm_from([type("F", (), {"f_locals": vars(main), "f_globals": {}})()]))
for name in list(sys.modules):
    if "sandbox" in name or "guard" in name:
        print("module", name)
attempt(lambda: read(SECRET))
""",
    "patch_builtins_and_posix": """
import builtins, posix, _stat
builtins.isinstance = lambda *a: True
builtins.PermissionError = type("P", (Exception,), {})
posix.lstat = posix.stat = lambda *a, **k: None
_stat.S_ISLNK = lambda m: False
posix.getcwd = lambda: "/"
attempt(lambda: read(SECRET))
attempt(lambda: read("../" * 8 + SECRET.lstrip("/")))
""",
    "another_audit_hook_and_tracing": """
sys.addaudithook(lambda *a: None)
attempt(lambda: sys.settrace(lambda *a: None))
attempt(lambda: sys.setprofile(lambda *a: None))
attempt(lambda: read(SECRET))
""",
    # ---- ways out through other programs and native code (the kernel must hold with the hook off)
    "exec_other_programs": """
attempt(lambda: os.execv("/bin/cat", ["cat", SECRET]))
attempt(lambda: os.system("cat " + SECRET))
import subprocess
attempt(lambda: subprocess.run(["cat", SECRET], capture_output=True).stdout)
""",
    "ctypes_libc_open": """
def go():
    import ctypes
    libc = ctypes.CDLL(None)
    fd = libc.open(SECRET.encode(), 0)
    buf = ctypes.create_string_buffer(4096)
    libc.read(fd, buf, 4096)
    return buf.value
attempt(go)
""",
    "mknod_and_mount": """
attempt(lambda: os.mknod(PWN, 0o600 | 0o060000, os.makedev(254, 0)))
attempt(lambda: read(PWN, mode="rb")[:64])
attempt(lambda: os.mkfifo(PUBLIC + "/" + PWN))
""",
    # ---- native code of its own, loaded from a writable place (each is a noexec tmpfs)
    "native_extension_from_run_folder": """
NATIVE_FROM = "."
"""
    + NATIVE,
    "native_extension_from_tmp": """
NATIVE_FROM = "/tmp"
"""
    + NATIVE,
    "native_extension_from_dev_shm": """
NATIVE_FROM = "/dev/shm"
"""
    + NATIVE,
    # ---- programs: a fresh interpreter would have no hook
    "execve_a_fresh_interpreter": """
attempt(lambda: os.execv(sys.executable, [sys.executable, "-c", "print(" + repr(ESCAPED) + ")"]))
attempt(lambda: os.posix_spawn(sys.executable, [sys.executable, "-c", "print(1)"], {}))
def raw():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    argv = (ctypes.c_char_p * 4)(sys.executable.encode(), b"-c", ("print(" + repr(ESCAPED) + ")").encode(), None)
    return libc.syscall(NR["execve"], sys.executable.encode(), argv, None), os.strerror(ctypes.get_errno())
attempt(raw)
""",
    # ---- the parent's keyrings
    "keyring_read_the_parents_key": """
def go():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    key = libc.syscall(NR["keyctl"], 10, -3, b"user", KEY_NAME.encode(), 0)  # KEYCTL_SEARCH in the session keyring
    if key < 0:
        return "search", os.strerror(ctypes.get_errno())
    buf = ctypes.create_string_buffer(4096)
    got = libc.syscall(NR["keyctl"], 11, key, buf, 4096)  # KEYCTL_READ
    return got, buf.value
attempt(go)
""",
    "keyring_add_and_link": """
def go():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    found = []
    for ring in (-3, -4, -5):  # session, user, user-session keyrings
        key = libc.syscall(NR["add_key"], b"user", (PWN + str(ring)).encode(), b"x", 1, ring)
        found.append((ring, key, os.strerror(ctypes.get_errno())))
        if key > 0:
            escaped("added a key to keyring %d" % ring)
            libc.syscall(NR["keyctl"], 8, key, -4)  # KEYCTL_LINK into the user keyring
    libc.syscall(NR["keyctl"], 1, b"lit-agentrl-sandbox")  # KEYCTL_JOIN_SESSION_KEYRING
    return found
attempt(go)
""",
    # ---- the machine's System V and POSIX IPC
    "sysv_ipc_read_and_leave_behind": """
def go():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    found = []
    shm = libc.syscall(NR["shmget"], IPC_KEY, 0, 0)
    found.append(("shmget", shm, os.strerror(ctypes.get_errno())))
    if shm >= 0:
        address = libc.shmat(shm, None, 0)
        found.append(ctypes.string_at(address, 80))
    msg = libc.syscall(NR["msgget"], IPC_KEY, 0)
    found.append(("msgget", msg, os.strerror(ctypes.get_errno())))
    for call, args in (("shmget", (0, 4096, 0o1666)), ("msgget", (0, 0o1666)), ("semget", (0, 1, 0o1666))):
        made = libc.syscall(NR[call], *args)  # IPC_PRIVATE | IPC_CREAT: objects that would outlive the run
        if made >= 0:
            escaped(call + " made an IPC object")
    return found
attempt(go)
""",
    "posix_message_queue": """
def go():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    found = []
    for name, flags in ((MQ_NAME, 0), ("/" + PWN, 0o100 | 2)):  # read the machine's; make one (O_CREAT|O_RDWR)
        mq = libc.syscall(NR["mq_open"], name[1:].encode(), flags, 0o666, None)
        found.append((name, mq, os.strerror(ctypes.get_errno())))
        if mq >= 0:
            escaped("opened POSIX message queue " + name)
    return found
attempt(go)
""",
    # ---- files by handle: past every folder's permissions
    "open_by_handle_at_root": """
def go():
    import ctypes, struct
    libc = ctypes.CDLL(None, use_errno=True)
    handle = ctypes.create_string_buffer(struct.pack("II", 8, 1) + struct.pack("II", 2, 0))  # inode 2: a root
    mount_id = ctypes.c_int()
    here = ctypes.create_string_buffer(struct.pack("II", 128, 0) + bytes(128))
    named = libc.syscall(NR["name_to_handle_at"], -100, b".", here, ctypes.byref(mount_id), 0)
    fd = libc.syscall(NR["open_by_handle_at"], os.open(".", os.O_RDONLY), handle, 0o200000)  # O_DIRECTORY
    if fd >= 0:
        escaped("open_by_handle_at")
        return os.listdir(fd)
    return named, fd, os.strerror(ctypes.get_errno())
attempt(go)
""",
    # ---- memory and disk the rlimits do not count
    "memfd_and_fallocate": """
def go():
    try:
        fd = os.memfd_create("x")
    except OSError as e:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(NR["memfd_create"], b"x", 0)
        if fd < 0:
            return "memfd", e, os.strerror(ctypes.get_errno())
    os.posix_fallocate(fd, 0, 1536 * 2**20)
    escaped("held 1.5 GiB in a memfd")
attempt(go)
""",
    "fallocate_past_the_limits": """
def go():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    found = []
    for place in (".", "/tmp", "/dev/shm"):
        fd = os.open(place + "/" + PWN, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.posix_fallocate(fd, 0, 4 * 2**30)
            escaped("posix_fallocate of 4 GiB in " + place)
        except OSError as e:
            found.append((place, "posix_fallocate", e.errno))
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        if libc.fallocate(fd, 1, 0, 2**31) == 0:  # FALLOC_FL_KEEP_SIZE: past RLIMIT_FSIZE
            escaped("FALLOC_FL_KEEP_SIZE in " + place)
        found.append((place, "keep_size", os.strerror(ctypes.get_errno())))
        os.close(fd)
    return found
attempt(go)
""",
    "fill_every_writable_place": """
def go():
    total = 0
    chunk = b"x" * 2**20
    for place in (".", "/tmp", "/dev/shm"):
        for n in range(400):
            try:
                with open(place + "/fill%d" % n, "wb") as f:
                    f.write(chunk * 8)
                total += 8
            except OSError:
                break
    if total > 160:  # the run's tmpfs is 4 x file_size_mb = 64 MiB (plus what the hook lets it write)
        escaped("stored %d MiB" % total)
    return total
attempt(go)
""",
    # ---- the parent's cleanup
    "deep_tree_setuid_and_locked": """
def go():
    for _ in range(1200):
        os.mkdir("d")
        os.chdir("d")
    with open("suid", "w") as f:
        f.write("#!/bin/sh\\\\n")
    os.chmod("suid", 0o4755)
    os.chdir("/")
    return os.stat("suid" if os.path.exists("suid") else "/").st_mode
attempt(go)
""",
    # ---- readers the hook does not see (C libraries opening files themselves)
    "ssl_spwd_sqlite_read": """
def ssl_read():
    import ssl
    ssl.create_default_context().load_verify_locations(SECRET)
attempt(ssl_read)
def shadow():
    import spwd
    escaped("read the shadow file") if spwd.getspall() else None
attempt(shadow)
def sqlite_tmp():
    import sqlite3
    sqlite3.connect("/tmp/" + PWN + ".db").execute("create table t(x)")
    return os.listdir("/tmp")
attempt(sqlite_tmp)
""",
}


@pytest.fixture(scope="module")
def canaries():
    """The canaries; yields their paths and their state, removed afterwards."""
    top = Path(tempfile.mkdtemp(prefix="lit-agentrl-canary-", dir="/tmp"))
    os.chmod(top, 0o755)
    secret = top / "root-only.txt"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    checkout = top / "checkout"
    checkout.mkdir(mode=0o755)
    (checkout / "pyproject.toml").write_text(f"[project]\nname = '{SECRET}'\n")
    (checkout / LISTING).write_text(SECRET)
    os.chmod(checkout / "pyproject.toml", 0o644)
    public = top / "public"
    public.mkdir()
    os.chmod(public, 0o1777)
    pub_canary = public / "shared.txt"
    pub_canary.write_text(SECRET)
    os.chmod(pub_canary, 0o666)
    shm = Path(f"/dev/shm/lit-agentrl-canary-{TOKEN}")
    shm.write_text(SECRET)
    os.chmod(shm, 0o644)
    paths = {
        "SECRET": str(secret),
        "CHECKOUT": str(checkout),
        "PUBLIC": str(public),
        "PUBCANARY": str(pub_canary),
        "SHM": str(shm),
        "REPO_FILE": str(REPO / "pyproject.toml"),
        "LISTING_DIR_FILE": "pyproject.toml",
    }
    try:
        yield paths
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shm.unlink(missing_ok=True)
        for leftover in glob.glob(f"/tmp/{PWN}*") + glob.glob(f"/dev/shm/{PWN}*"):
            Path(leftover).unlink(missing_ok=True)


def _syscall_numbers() -> dict[str, int]:
    import pyseccomp

    names = ("execve", "keyctl", "add_key", "shmget", "msgget", "semget", "mq_open", "memfd_create")
    names += ("name_to_handle_at", "open_by_handle_at")
    return {name: pyseccomp.resolve_syscall(pyseccomp.system_arch(), name) for name in names}


LIBC = ctypes.CDLL(None, use_errno=True)
NR = _syscall_numbers() if not seccomp_missing() else {}


def _checked(value: int, what: str) -> int:
    if value < 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")
    return value


@pytest.fixture(scope="module")
def host_objects():
    """The secret in this process's session keyring, a System V segment and queue, a POSIX message queue."""
    if not NR:
        pytest.skip(f"the canaries are made with raw system calls, numbered by libseccomp: {seccomp_missing()}")
    key = _checked(LIBC.syscall(NR["add_key"], b"user", KEY_NAME.encode(), SECRET.encode(), len(SECRET), -3), "add_key")
    shm = _checked(LIBC.syscall(NR["shmget"], IPC_KEY, 4096, 0o1600), "shmget")
    LIBC.shmat.restype = ctypes.c_void_p
    address = LIBC.shmat(shm, None, 0)
    ctypes.memmove(address, SECRET.encode(), len(SECRET))
    LIBC.shmdt(ctypes.c_void_p(address))
    queue = _checked(LIBC.syscall(NR["msgget"], IPC_KEY, 0o1600), "msgget")
    message = struct.pack("l", 1) + SECRET.encode()
    _checked(LIBC.msgsnd(queue, message, len(SECRET), 0), "msgsnd")
    LIBC.mq_open.restype = ctypes.c_int
    mq = _checked(LIBC.mq_open(MQ_NAME.encode(), os.O_CREAT | os.O_RDWR, 0o600, None), "mq_open")
    _checked(LIBC.mq_send(mq, SECRET.encode(), len(SECRET), 0), "mq_send")
    try:
        yield {"key": key}
    finally:
        LIBC.syscall(NR["keyctl"], 21, key)  # KEYCTL_INVALIDATE
        LIBC.shmctl(shm, 0, None)  # IPC_RMID
        LIBC.msgctl(queue, 0, None)
        LIBC.mq_close(mq)
        LIBC.mq_unlink(MQ_NAME.encode())


def _key_payload(key: int) -> bytes:
    buffer = ctypes.create_string_buffer(4096)
    size = LIBC.syscall(NR["keyctl"], 11, key, buffer, 4096)  # KEYCTL_READ
    return buffer.raw[: max(size, 0)]


def state(paths: dict[str, str], objects: dict[str, int]) -> dict[str, object]:
    """What must not change: each canary's content and metadata, the world-writable folders' contents, the
    machine's keys and IPC objects, and nothing of a run left on the host (folders, mounts, cgroups)."""
    found: dict[str, object] = {}
    for key in ("SECRET", "PUBCANARY", "SHM", "CHECKOUT"):
        st = os.lstat(paths[key])
        content = sorted(os.listdir(paths[key])) if stat.S_ISDIR(st.st_mode) else Path(paths[key]).read_text()
        found[key] = (content, st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_nlink)
    found["public"] = sorted(os.listdir(paths["PUBLIC"]))
    found["pwned"] = sorted(glob.glob(f"/tmp/{PWN}*") + glob.glob(f"/dev/shm/{PWN}*"))
    # weak runs' host folders (other sandbox processes' mount points, lit-agentrl-sandbox-mnt-*, come and go)
    found["run folders"] = sorted(p for p in glob.glob("/tmp/lit-agentrl-sandbox-*") if "-mnt-" not in p)
    found["mount point"] = os.listdir(boundary.mount_point())
    found["cgroups"] = glob.glob(f"/sys/fs/cgroup/**/lit-agentrl-sandbox/run-{os.getpid()}-*", recursive=True)
    found["key"] = _key_payload(objects["key"])
    found["session keyring"] = _key_payload(-3)
    found["key users"] = Path("/proc/key-users").read_text()
    found["ipc"] = [Path(f"/proc/sysvipc/{kind}").read_text() for kind in ("shm", "msg", "sem")]
    return found


def program(name: str, paths: dict[str, str]) -> str:
    constants = "".join(f"{key} = {value!r}\n" for key, value in paths.items())
    constants += f"PWN = {PWN!r}\nESCAPED = {ESCAPED!r}\nKEY_NAME = {KEY_NAME!r}\nIPC_KEY = {IPC_KEY}\n"
    constants += f"MQ_NAME = {MQ_NAME!r}\nNR = {NR!r}\nWORK = os.getcwd()\n"
    return PRELUDE + constants + SNIPPETS[name]


def _sandbox(hook: bool) -> PythonSandbox:
    """A sandbox with the corpus's limits (the ``sandbox_boundary`` fixture has checked it can be built)."""
    sandbox = PythonSandbox(LIMITS)
    sandbox._guard = hook
    return sandbox


@pytest.fixture(scope="module")
def guarded() -> PythonSandbox:
    return _sandbox(hook=True)


@pytest.fixture(scope="module")
def kernel_only() -> PythonSandbox:
    """The audit hook switched off: the kernel's layers alone."""
    return _sandbox(hook=False)


def test_the_corpus_is_big_enough():
    assert len(SNIPPETS) >= 60


def check(sandbox: PythonSandbox, name: str, paths: dict[str, str], objects: dict[str, int]) -> None:
    before = state(paths, objects)
    result = sandbox.run(program(name, paths))
    text = result.stdout + result.stderr
    assert ESCAPED not in text, f"{name} got past a layer:\n{text}"
    assert SECRET not in text, f"{name} read a canary:\n{text}"
    assert LISTING not in text, f"{name} listed the checkout:\n{text}"
    assert "[build-system]" not in text, f"{name} read the project's pyproject.toml:\n{text}"
    assert state(paths, objects) == before, f"{name} changed a canary, wrote outside or left something:\n{text}"
    # Refused in its setup, or it ran its attempts; not broken by a mistake of its own.
    assert not any(f"{bug}Error:" in text for bug in ("Name", "Syntax", "Indentation", "Unbound")), text


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_with_the_audit_hook(guarded, canaries, host_objects, name):
    check(guarded, name, canaries, host_objects)


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_with_the_kernel_layers_alone(kernel_only, canaries, host_objects, name):
    check(kernel_only, name, canaries, host_objects)


# ------------------------------------------------------------------- across runs, and the parent's own side


def interpreter_tops_under_tmp(python: str) -> list[str]:
    """The names in a run's /tmp that are not the run's own: the top folders of the interpreter's read-only binds
    that live under the machine's /tmp (a venv made there), none for an interpreter elsewhere."""
    binds = boundary.interpreter_layout(python, site=False).binds
    return sorted({Path(path).relative_to("/tmp").parts[0] for path in binds if path.startswith("/tmp/")})


def test_a_later_run_finds_nothing_of_an_earlier_one(kernel_only):
    leave = "open('/tmp/left', 'w').write('x'); open('/dev/shm/left', 'w').write('x'); open('left', 'w').write('x')"
    assert kernel_only.run(leave).error is None
    look = "import os\nprint([sorted(os.listdir(p)) for p in ('/tmp', '/dev/shm', '.')])"
    assert kernel_only.run(look).stdout.strip() == str([interpreter_tops_under_tmp(sys.executable), [], ["main.py"]])


def test_processes_left_running_are_killed():
    """With forks allowed, a daemonised grandchild outlives its parent: not the run."""
    _sandbox(hook=False)  # skips (or fails) where the boundary is missing
    forking = PythonSandbox(dataclasses.replace(LIMITS, max_processes=4))
    forking._guard = False
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n"
    code += f"        print({ESCAPED!r})\n    os._exit(0)\nprint('parent done')"
    result = forking.run(code)
    assert result.stdout.strip() == "parent done", result.error
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _run_processes():
        time.sleep(0.05)
    assert not _run_processes()


def _run_processes() -> list[int]:
    from lit_agentrl.tools.sandbox.runner import TOKEN_PREFIX

    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if f"{TOKEN_PREFIX}{os.getpid()}-".encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found


def test_an_output_flood_costs_the_parent_little(kernel_only):
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = kernel_only.run("import sys\nwhile True: sys.stdout.write('x' * 65536)")
    after = resource.getrusage(resource.RUSAGE_SELF)
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert result.error.startswith("OutputError")
    assert spent < LIMITS.cpu_seconds, f"the parent spent {spent:.2f} s of CPU on one run's output"


def test_the_boundary_does_not_depend_on_the_parents_umask(canaries, host_objects):
    previous = os.umask(0o027)
    try:
        check(_sandbox(hook=False), "dir_fd_from_root", canaries, host_objects)
        check(_sandbox(hook=False), "open_by_handle_at_root", canaries, host_objects)
        assert _sandbox(hook=False).run("print(1)").stdout == "1\n"
    finally:
        os.umask(previous)


def test_an_interpreter_under_tmp_gets_the_whole_boundary(tmp_path, canaries, host_objects):
    """The run's private /tmp must not hide an interpreter that lives under the machine's /tmp; a venv's own
    site-packages are shown with ``site_packages=True`` and hidden without."""
    venv = Path(tempfile.mkdtemp(prefix="lit-agentrl-venv-", dir="/tmp"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        os.chmod(venv, 0o755)
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        (site / "venv_marker.py").write_text("WHERE = 'venv'\n")
        with_site = PythonSandbox(LIMITS, python=str(venv / "bin" / "python"), site_packages=True)
        assert with_site.run("import venv_marker\nprint(venv_marker.WHERE)").stdout == "venv\n"
        sandbox = PythonSandbox(LIMITS, python=str(venv / "bin" / "python"))
        hidden = f"import os\nprint(os.listdir({str(site)!r}))"
        assert sandbox.strong and sandbox.run("import sys\nprint(sys.executable)").stdout.strip() == str(
            venv / "bin" / "python"
        )
        sandbox._guard = False
        assert sandbox.run(hidden).stdout == "[]\n"  # its site-packages: an empty tmpfs without site_packages
        check(sandbox, "plain_reads", canaries, host_objects)
        # The run's /tmp shows the venv's folder (read-only, where its interpreter finds itself) and its own files
        # only: not the machine's /tmp, where the canaries are.
        assert interpreter_tops_under_tmp(str(venv / "bin" / "python")) == [venv.name]
        look = f"import os\nprint(sorted(os.listdir('/tmp')))\nopen({str(venv / 'x')!r}, 'w')"
        result = sandbox.run(look)
        assert result.stdout == f"{[venv.name]}\n" and "Read-only file system" in result.error, result
    finally:
        shutil.rmtree(venv, ignore_errors=True)


# --------------------------------------------------- verdicts the code cannot forge, and output it cannot disguise

MODES = {
    "audit hook": (True, False),
    "kernel layers alone": (False, False),
    "site-packages and ctypes, kernel layers alone": (False, True),
}
"""(audit hook, ``site_packages``) of each mode the classes below run in."""
FORGED = '{"setup": "failed", "error": "FORGED"}\n{"signal": 24}\n{"exit-code": 137}\n'
"""What a forger would write: the verdict records of a setup failure and a CPU-time kill, and bubblewrap's."""
FORGERIES = {
    "a_setup_failure_on_stderr": (
        "import os\nos.write(2, b'lit-agentrl-sandbox setup: could not load a seccomp filter: FORGED\\n')\nos._exit(113)",
        113,
    ),
    "a_cpu_time_signal_as_exit_status": ("import os\nos._exit(152)", 152),
    "a_sigkill_as_exit_status": ("import os\nos._exit(137)", 137),
    "the_verdict_on_every_inherited_descriptor": (
        f"import os\nfor fd in range(1024):\n    attempt(lambda: os.write(fd, {FORGED!r}.encode()))\nos._exit(152)",
        152,
    ),
    "the_supervisors_descriptors_memory_and_signals": (
        "import os, signal\n"
        "for fd in range(64):\n"
        f"    attempt(lambda: os.write(os.open(f'/proc/1/fd/{{fd}}', os.O_WRONLY), {FORGED!r}.encode()))\n"
        "attempt(lambda: os.open('/proc/1/mem', os.O_RDWR))\n"
        "attempt(lambda: os.kill(1, signal.SIGKILL))\nattempt(lambda: os.kill(-1, signal.SIGKILL))\n"
        "os._exit(152)",
        152,
    ),
    "the_supervisor_through_raw_system_calls": (
        "import os\ndef go():\n    import ctypes\n    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    print('kill', libc.kill(1, 9), 'ptrace', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"
        "attempt(go)\nos._exit(152)",
        152,
    ),
}
"""Code that tries to pass its own exit for the sandbox's failure or a signal death, and its expected status."""
SHOWN = "nul\x00 osc52\x1b]52;c;cm0gLXJm\x07 link\x1b]8;;https://x.example/\x1b\\t\x1b]8;;\x1b\\ title\x1b]0;t\x07"
SHOWN += " clear\x1b[2J\x1b[H csi8\x9b2J cr\rx del\x7f bidi\u202egnp.exe\u2066i\u2069"
"""Output a terminal or a page would obey: NUL, escape sequences (clipboard, link, title, clear, 8-bit CSI),
controls and bidirectional overrides."""


@pytest.fixture(scope="module", params=sorted(MODES))
def every_mode(request) -> PythonSandbox:
    hook, site = MODES[request.param]
    _sandbox(hook)  # skips (or fails) where the boundary is missing
    sandbox = PythonSandbox(LIMITS, site_packages=site)
    sandbox._guard = hook
    return sandbox


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_no_forged_verdict_is_believed(every_mode, name):
    code, status = FORGERIES[name]
    result = every_mode.run(PRELUDE + f"ESCAPED = {ESCAPED!r}\n" + code)
    assert result.exit_code == status and not result.timed_out, (name, result)
    assert not result.error.startswith(("SandboxError", "TimeoutError", "Killed", "MemoryError")), result.error


@pytest.mark.parametrize(
    ("code", "status", "error"),
    [
        ("while True: pass", -signal.SIGXCPU, "TimeoutError: the code used more than"),
        ("import signal\nsignal.raise_signal(signal.SIGSEGV)", -signal.SIGSEGV, "Killed by SIGSEGV"),
        ("raise SystemExit(3)", 3, "the code exited with status 3"),
    ],
)
def test_real_signals_and_exit_statuses_are_reported_as_they_were(every_mode, code, status, error):
    result = every_mode.run(code)
    assert result.exit_code == status and result.error.startswith(error), result


def test_the_output_reaches_the_model_unchanged_and_is_shown_inert(every_mode):
    from lit_agentrl.display import INERT_CHARACTERS, inert

    result = every_mode.run(f"import sys\nprint({SHOWN!r})\nsys.stderr.write({SHOWN!r})")
    assert result.stdout == SHOWN + "\n" and result.stderr == SHOWN and result.as_tool_text() == SHOWN
    assert not set(inert(result.as_tool_text())) & INERT_CHARACTERS


def test_mountinfo_lists_the_runs_own_mounts_only(every_mode, canaries):
    """``/proc/self/mountinfo`` shows each of the run's mounts with its path on the host (the same as inside) and
    the host's device and options, and nothing of the host's other mounts: not the project, not the canaries'
    folder, not the trainer's mount point under /tmp. (What holds and what does not: docs/sandbox.md.)"""
    result = every_mode.run("print(open('/proc/self/mountinfo').read())")
    if every_mode._guard:  # the audit hook refuses reading it at all
        assert "PermissionError: sandbox: reading '/proc/" in result.error, result
        return
    text = result.stdout
    mounts = [line.split()[4] for line in text.splitlines() if line.strip()]
    assert "/proc" in mounts and "/home/sandbox" in mounts, text
    for host_path in (str(REPO), os.path.dirname(canaries["SECRET"]), boundary.mount_point(), "/etc/hostname"):
        assert host_path not in text, (host_path, text)


def test_inotify_on_the_shared_files_is_refused(every_mode):
    """A watch on the read-only files runs share with the host would show when others use them: refused by the
    seccomp filter (through ctypes, where ctypes can be imported at all)."""
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.inotify_init1(0)\n"
    code += "print('inotify', fd, ctypes.get_errno())"
    result = every_mode.run(code)
    if every_mode._guard and not every_mode.site_packages:  # the hook refuses importing ctypes
        assert "sandbox: importing ctypes is not allowed" in result.error, result
    else:
        assert result.stdout == f"inotify -1 {errno.EPERM}\n", result
