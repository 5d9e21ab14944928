"""The sandbox's system-call filters (seccomp), compiled by libseccomp into the BPF programs the kernel runs.

Two filters, both denying with ``EPERM`` (``ENOSYS`` for ``clone3``, so the C library falls back to ``clone``,
whose flags a filter can see):

* :func:`boundary_filter`, loaded by bubblewrap just before it starts the interpreter: what Python code never
  needs and what would reach past the run's namespaces and limits (:data:`DENIED`), namespace flags on
  ``clone``, socket families other than local, IPv4 and IPv6, ``fallocate`` modes other than 0 (the others get
  past ``RLIMIT_FSIZE``), ``ioctl(TIOCSTI)``, ``personality`` other than plain Linux.
* :func:`exec_filter`, loaded by the child itself once its interpreter has started and before the model's
  code runs: no ``execve``/``execveat``, so no second program (and no fresh interpreter without the hook).

A filter for another architecture than the machine's kills the calling process (libseccomp's default for a
foreign architecture), so 32-bit system calls do not get around the lists.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
from collections.abc import Iterable

__all__ = ["DENIED", "boundary_filter", "exec_filter", "seccomp_missing"]

DENIED: dict[str, tuple[str, ...]] = {
    "keyrings (the parent's session keyring, the uid's user keyring)": ("add_key", "keyctl", "request_key"),
    "memory outside the address-space limit, and memory fault handling": (
        "memfd_create",
        "memfd_secret",
        "userfaultfd",
    ),
    "io_uring (system calls a filter cannot see)": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "other processes' memory": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"),
    "mounts and namespaces": (
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "open_tree",
        "move_mount",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
        "unshare",
        "setns",
    ),
    "files by handle (past every directory's permissions)": ("open_by_handle_at", "name_to_handle_at"),
    "the kernel's programs and counters": ("bpf", "perf_event_open", "fanotify_init", "lookup_dcookie"),
    "System V and POSIX message-queue IPC": (
        "msgget",
        "msgsnd",
        "msgrcv",
        "msgctl",
        "semget",
        "semop",
        "semtimedop",
        "semctl",
        "shmget",
        "shmat",
        "shmdt",
        "shmctl",
        "mq_open",
        "mq_unlink",
        "mq_timedsend",
        "mq_timedreceive",
        "mq_notify",
        "mq_getsetattr",
    ),
    "the machine's administration": (
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "reboot",
        "swapon",
        "swapoff",
        "syslog",
        "acct",
        "quotactl",
        "quotactl_fd",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "ioperm",
        "iopl",
        "vhangup",
        "uselib",
        "sysfs",
        "nfsservctl",
        "sethostname",
        "setdomainname",
        "mknod",
        "mknodat",
        "mbind",
        "set_mempolicy",
        "migrate_pages",
        "move_pages",
    ),
}
"""The system calls :func:`boundary_filter` denies outright, by what they would reach."""

CLONE_NAMESPACES = 0x7E020000
"""``CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET``: a ``clone`` with any is denied."""
SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)
"""The only socket families allowed (the network namespace has nothing to reach with them)."""
TIOCSTI = 0x5412
PER_LINUX = 0
EXEC_CALLS = ("execve", "execveat")


def seccomp_missing() -> str | None:
    """Why filters cannot be built here (libseccomp's Python binding or library missing), or None."""
    try:
        import pyseccomp  # noqa: F401  (ctypes over the system's libseccomp.so.2)
    except (ImportError, OSError) as exc:
        return f"libseccomp is not usable ({type(exc).__name__}: {exc}; Debian: apt-get install libseccomp2)"
    return None


def _compile(rules: Iterable[tuple[int, str, tuple[object, ...]]]) -> bytes:
    """A BPF program that allows everything but ``rules`` (errno, system call, argument conditions)."""
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW)
    arch = sc.system_arch()
    for error, name, conditions in rules:
        try:
            if int(sc.resolve_syscall(arch, name)) < 0:
                continue  # not a system call on this architecture
        except ValueError:
            continue  # a name this libseccomp does not know
        flt.add_rule(sc.ERRNO(error), name, *conditions)
    read, write = os.pipe()
    try:
        with os.fdopen(write, "wb", closefd=True) as sink:
            flt.export_bpf(sink)
        chunks = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(read)


@functools.cache
def boundary_filter() -> bytes:
    """The run's main filter (see the module's docstring), as a BPF program for bubblewrap's ``--seccomp``."""
    import pyseccomp as sc

    rules: list[tuple[int, str, tuple[object, ...]]] = [
        (errno.EPERM, name, ()) for names in DENIED.values() for name in names
    ]
    rules.append((errno.ENOSYS, "clone3", ()))
    for bit in range(32):
        flag = 1 << bit
        if CLONE_NAMESPACES & flag:
            rules.append((errno.EPERM, "clone", (sc.Arg(0, sc.MASKED_EQ, flag, flag),)))
    for family in range(64):  # AF_MAX is below 64
        if family not in SOCKET_FAMILIES:
            rules.append((errno.EAFNOSUPPORT, "socket", (sc.Arg(0, sc.EQ, family),)))
    rules.append((errno.EPERM, "fallocate", (sc.Arg(1, sc.NE, 0),)))
    rules.append((errno.EPERM, "ioctl", (sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, TIOCSTI),)))
    rules.append((errno.EPERM, "personality", (sc.Arg(0, sc.NE, PER_LINUX),)))
    return _compile(rules)


@functools.cache
def exec_filter() -> bytes:
    """No more programs: the filter the child loads once its interpreter runs (see the module's docstring)."""
    return _compile((errno.EPERM, name, ()) for name in EXEC_CALLS)
