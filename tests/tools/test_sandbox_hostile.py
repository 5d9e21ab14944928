"""Hostile snippets against the sandbox's file-system boundary: each must leave the canaries unread and unchanged.

The canaries, outside any run's folder: a root-only file (mode 0600) in a folder of this test's, a project
checkout (world-readable, with a file whose name is a secret too), a file in ``/dev/shm``, and a world-writable
folder holding a world-writable file. After each snippet: no secret in its output, every canary as it was, and
nothing new in the world-writable folders (the snippets name what they try to create after ``PWN``).

Every snippet runs twice where the kernel builds the run's own root: with the audit hook, and without it (the
kernel's mount namespace alone must hold). The snippets use no interpreter bug; most try to get around the
hook (file descriptors relative to a directory, ``/proc/self/fd`` and ``/proc/self/root``, ``chdir``, links)
or to disarm it from inside (frames, tracebacks, closures, defaults, ``gc``, module and builtin patching).
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path

import pytest

from lit_agentrl.tools.sandbox import PythonSandbox, SandboxLimits

pytestmark = pytest.mark.slow

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=30, output_bytes=8192)
REPO = Path(__file__).resolve().parents[2]
TOKEN = uuid.uuid4().hex
SECRET = f"canary-secret-{TOKEN}"
LISTING = f"canary-name-{TOKEN}.txt"
PWN = f"PWN{TOKEN}"

PRELUDE = '''\
import os, sys
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


def state(paths: dict[str, str]) -> dict[str, object]:
    """What must not change: each canary's content and metadata, the world-writable folders' contents."""
    found: dict[str, object] = {}
    for key in ("SECRET", "PUBCANARY", "SHM", "CHECKOUT"):
        st = os.lstat(paths[key])
        content = sorted(os.listdir(paths[key])) if stat.S_ISDIR(st.st_mode) else Path(paths[key]).read_text()
        found[key] = (content, st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_nlink)
    found["public"] = sorted(os.listdir(paths["PUBLIC"]))
    found["pwned"] = sorted(glob.glob(f"/tmp/{PWN}*") + glob.glob(f"/dev/shm/{PWN}*"))
    return found


def program(name: str, paths: dict[str, str]) -> str:
    constants = "".join(f"{key} = {value!r}\n" for key, value in paths.items())
    constants += f"PWN = {PWN!r}\nWORK = os.getcwd()\n"
    return PRELUDE + constants + SNIPPETS[name]


@pytest.fixture(scope="module")
def guarded() -> PythonSandbox:
    return PythonSandbox(LIMITS)


@pytest.fixture(scope="module")
def kernel_only() -> PythonSandbox:
    """The audit hook switched off: the kernel's layers alone."""
    bare = PythonSandbox(LIMITS)
    if not bare.filesystem_isolated:
        pytest.skip("this machine offers no kernel file-system layer (the isolation report says so)")
    bare._guard = False
    return bare


def test_the_corpus_is_big_enough():
    assert len(SNIPPETS) >= 40


def check(sandbox: PythonSandbox, name: str, paths: dict[str, str]) -> None:
    before = state(paths)
    result = sandbox.run(program(name, paths))
    text = result.stdout + result.stderr
    assert SECRET not in text, f"{name} read a canary:\n{text}"
    assert LISTING not in text, f"{name} listed the checkout:\n{text}"
    assert "[build-system]" not in text, f"{name} read the project's pyproject.toml:\n{text}"
    assert state(paths) == before, f"{name} changed a canary or wrote outside:\n{text}"
    # Refused in its setup, or it ran its attempts; not broken by a mistake of its own.
    assert not any(f"{bug}Error:" in text for bug in ("Name", "Syntax", "Indentation", "Unbound")), text


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_with_the_audit_hook(guarded, canaries, name):
    check(guarded, name, canaries)


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_with_the_kernel_layers_alone(kernel_only, canaries, name):
    check(kernel_only, name, canaries)
