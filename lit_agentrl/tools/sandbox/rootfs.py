"""The run's file system: a minimal root, built in a mount namespace of its own, that the code cannot leave.

Stage 1 runs this as PID 1 of the run's new PID and mount namespaces, before any model code exists (see
:mod:`.stage1`). Like the stages, the child does not import this module: stage 1 gets its text in argv and
runs it in a namespace of its own. Hence: the standard library only, ASCII only, nothing done at import but
definitions.

The new root is a small read-only tmpfs holding, at the same paths as outside:

* read-only bind mounts of the interpreter (and its ``pyvenv.cfg``), its ELF loader, the directories of the
  shared libraries it has loaded, ``/etc/ld.so.cache``, and its library directories (``sys.path``; the
  site-packages directories with ``site``, else covered by an empty read-only tmpfs);
* the run's folder, writable (no suid, no devices);
* a private ``/tmp`` and ``/dev/shm`` (small tmpfs of their own), ``/dev/null``, ``zero``, ``random``,
  ``urandom``;
* ``/proc`` of the run's PID namespace (its own processes only).

Then ``pivot_root`` and a lazy unmount of the old root: nothing else of the machine has a path any more, so
file descriptors relative to a directory, ``/proc/self/fd``, ``/proc/self/root``, links and ``chdir`` lead
nowhere outside. ``mount`` and ``pivot_root`` are called through ctypes: Python 3.11 has no wrapper for them.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported in the child: it would cost every run its import time
if TYPE_CHECKING:
    from typing import Any

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 4096, 16384, 1 << 18, 2
ST_TO_MS = ((1, MS_RDONLY), (2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, 1024), (2048, 2048), (4096, 1 << 21))
"""statvfs ``f_flag`` bits to mount flags: a bind mount's remount must keep the source's locked flags."""
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203, "s390x": 217}
"""``pivot_root``'s syscall number (glibc has no wrapper) per machine; elsewhere there is no file-system layer."""
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
STAGING = ("/sys", "/mnt", "/srv", "/opt", "/media", "/home", "/var", "/tmp")
"""Where the new root is assembled (a private mount hides nothing outside): the first one holding no source."""

_libc: list[Any] = []


def call(name: str, *args: Any) -> None:
    """A libc function returning 0 on success (ints as unsigned long, str as bytes); OSError otherwise."""
    import ctypes

    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    converted = [ctypes.c_ulong(a) if isinstance(a, int) else os.fsencode(a) if isinstance(a, str) else a for a in args]
    if getattr(_libc[0], name)(*converted) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args[:2]!r}: {os.strerror(err)}")


def mount(source: str | None, target: str | None, fstype: str | None, flags: int, data: str | None = None) -> None:
    call("mount", source, target, fstype, flags, data)


def tmpfs(target: str, mode: int, size: str, flags: int = 0) -> None:
    os.makedirs(target, 0o755, exist_ok=True)
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | flags, f"mode={mode:o},size={size},nr_inodes=4096")


def bind(source: str, target: str, writable: bool) -> None:
    """Bind ``source`` at ``target``: read-only unless ``writable``; no suid; no devices but device files."""
    import stat

    mount(source, target, None, MS_BIND)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (0 if writable else MS_RDONLY)
    if not stat.S_ISCHR(os.stat(source).st_mode):
        flags |= MS_NODEV
    locked = os.statvfs(source).f_flag
    for st_bit, ms_bit in ST_TO_MS:
        if locked & st_bit:
            flags |= ms_bit
    mount(None, target, None, flags)


def mirror(path: str, new: str) -> str:
    """``path`` with its symbolic links resolved; each link met is recreated under ``new``, so that the same
    name resolves in the new root (a venv's ``bin/python``, a merged ``/lib``)."""
    todo = path.split("/")[::-1]
    real, hops = "", 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            real = real.rpartition("/")[0]
            continue
        candidate = real + "/" + part
        if not os.path.islink(candidate):
            real = candidate
            continue
        hops += 1
        if hops > 40:
            raise OSError(f"too many symbolic links in {path!r}")
        target = os.readlink(candidate)
        if not os.path.lexists(new + candidate):
            os.makedirs(new + (real or "/"), 0o755, exist_ok=True)
            os.symlink(target, new + candidate)
        if target.startswith("/"):
            real = ""
        todo.extend(target.split("/")[::-1])
    return real or "/"


def expose(paths: list[str], new: str, writable: bool = False) -> None:
    """Make ``paths`` (files or directories) visible under ``new`` at the same paths, by bind mounts; one
    below a directory bound already is visible through it."""
    reals = sorted({mirror(p, new) for p in paths if os.path.exists(p)}, key=lambda p: (p.count("/"), p))
    bound: list[str] = []
    for real in reals:
        if any(real.startswith(done + "/") for done in bound):
            continue
        target = new + real
        if os.path.isdir(real):
            os.makedirs(target, 0o755, exist_ok=True)
            bound.append(real)
        else:
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        bind(real, target, writable)


def elf_interpreter(path: str) -> str | None:
    """The dynamic loader named in an ELF executable's ``PT_INTERP`` header (it must exist in the new root)."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF":
                return None
            end = "<" if head[5] == 1 else ">"
            # 64-bit: e_phoff at 0x20, sizes at 0x36; p_offset at 8, p_filesz at 32. 32-bit: 0x1C, 0x2A; 4, 16.
            wide = head[4] == 2
            phoff = struct.unpack_from(end + ("Q" if wide else "I"), head, 0x20 if wide else 0x1C)[0]
            phentsize, phnum = struct.unpack_from(end + "HH", head, 0x36 if wide else 0x2A)
            word, at_offset, at_size = ("Q", 8, 32) if wide else ("I", 4, 16)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                entry = f.read(phentsize)
                if struct.unpack_from(end + "I", entry, 0)[0] == 3:  # PT_INTERP
                    f.seek(struct.unpack_from(end + word, entry, at_offset)[0])
                    size = struct.unpack_from(end + word, entry, at_size)[0]
                    return f.read(size).rstrip(b"\0").decode()
    except (OSError, ValueError, struct.error):
        return None
    return None


def loaded_library_dirs() -> set[str]:
    """Directories of the shared objects this interpreter has mapped (libc, libpython, ...): their siblings
    are what its extension modules load later (libffi, libssl, libz, ...)."""
    dirs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/") and ".so" in fields[5]:
                path = fields[5].strip()
                if os.path.exists(path):
                    dirs.add(os.path.dirname(path))
    return dirs


def site_dirs() -> set[str]:
    import sysconfig

    paths = sysconfig.get_paths()
    return {os.path.realpath(paths[key]) for key in ("purelib", "platlib") if paths.get(key)}


def sources(site: bool) -> list[str]:
    """What the new root shows read-only: the interpreter and what it needs, ``sys.path``, site-packages."""
    exe = sys.executable
    found = {exe, "/etc/ld.so.cache", *loaded_library_dirs()}
    found |= {p for p in sys.path if p.startswith("/")}
    for cfg in (
        os.path.join(os.path.dirname(exe), "pyvenv.cfg"),
        os.path.join(os.path.dirname(os.path.dirname(exe)), "pyvenv.cfg"),
    ):
        found.add(cfg)
    loader = elf_interpreter(os.path.realpath(exe))
    if loader:
        found.add(loader)
    if site:
        found |= site_dirs()
    return sorted(found)


def staging_dir(used: list[str]) -> str:
    for candidate in STAGING:
        free = not any(p == candidate or p.startswith(candidate + "/") for p in used)
        if free and os.path.isdir(candidate) and not os.path.islink(candidate):
            return candidate
    raise OSError("no directory to assemble the new root in")


def add_devices(new: str, scratch: str) -> None:
    """``/dev`` with the harmless devices, ``/dev/fd`` and a private ``/dev/shm``."""
    os.makedirs(new + "/dev", 0o755, exist_ok=True)
    expose(list(DEVICES), new, writable=True)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, new + "/dev/" + name)
    tmpfs(new + "/dev/shm", 0o1777, scratch)


def switch_root(new: str, work: str) -> None:
    """``pivot_root`` into ``new``, detach the old root (nothing of it keeps a path), enter ``work``."""
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root's syscall number on {os.uname().machine} is not known here")
    os.chdir(new)
    call("syscall", number, ".", ".")
    call("umount2", ".", MNT_DETACH)
    os.chdir(work)


def build_root(work: str, site: bool, scratch_bytes: int) -> None:
    """Build the run's root and move into it; the caller is root (of a user namespace, or the machine) and
    alone in new mount and PID namespaces. ``scratch_bytes``: the size of the private /tmp and /dev/shm."""
    read_only = sources(site)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates back to the machine
    new = staging_dir([*read_only, work, *DEVICES])
    tmpfs(new, 0o755, "1m")
    for name in os.listdir("/"):  # /lib -> usr/lib and the like: ld.so.cache names libraries through them
        if name.startswith("lib") and os.path.islink("/" + name):
            mirror("/" + name, new)
    expose(read_only, new)
    scratch = str(max(scratch_bytes, 1 << 20))
    tmpfs(new + "/tmp", 0o1777, scratch)
    add_devices(new, scratch)
    expose([work], new, writable=True)
    if not site:
        for path in site_dirs():
            if os.path.isdir(new + path):
                tmpfs(new + path, 0o755, "4k", MS_RDONLY)
    os.makedirs(new + "/proc", 0o755)
    mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    switch_root(new, work)
