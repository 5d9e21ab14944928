"""The sandbox's system-call filters (seccomp), compiled by libseccomp into the BPF programs the kernel runs.

Two filters:

* :func:`boundary_filter`, loaded by bubblewrap just before it starts the interpreter (the run's PID 1, the
  supervisor, whose fork runs the code): an allow-list (:mod:`.allowed`, measured). What is not on it is refused with ``ENOSYS``, as by
  a kernel without the call, so libraries take their fallbacks; that default covers every number, those this
  libseccomp has no name for included. The calls of :data:`DENIED` get ``EPERM`` (clearer to the code). Calls
  allowed for some arguments only, compared at the width the kernel reads (an ``int`` argument on its low 32
  bits, the rest of the register ignored as the kernel ignores it): ``clone`` without namespace flags (``EPERM``
  with one), ``socket``/``socketpair`` of local, IPv4 and IPv6 families (``EAFNOSUPPORT`` for the others), a
  few ``ioctl`` requests and ``prctl`` options, ``fallocate`` with mode 0 (the others get past
  ``RLIMIT_FSIZE``); other arguments get the default, ``ENOSYS``.
* :func:`exec_filter`, loaded by the child itself once its interpreter has started and before the model's
  code runs: no ``execve``/``execveat``, so no second program (and no fresh interpreter without the hook).

A system call of another architecture than the machine's (x32, or i386 through ``int 0x80`` on x86-64) kills
the calling process (libseccomp's action for a foreign architecture).
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Iterable

from lit_agentrl.tools.sandbox.allowed import (
    ALLOWED,
    CLONE_NAMESPACES,
    DENIED,
    IOCTLS,
    PRCTL_OPTIONS,
    SOCKET_FAMILIES,
)

__all__ = ["DENIED", "boundary_filter", "exec_filter", "known", "seccomp_missing"]

INT = 0xFFFFFFFF
"""The mask of an ``int`` argument: the kernel reads the register's low 32 bits."""
AF_MAX = 64
"""Above every address family this kernel generation has (AF_MAX is 46): each lower one gets ``EAFNOSUPPORT``."""
EXEC_CALLS = ("execve", "execveat")

Rule = tuple[int, str, tuple[object, ...]]
"""An action (``ALLOW`` or an errno), a system call's name, and argument conditions (all must hold)."""
ALLOW = -1


def seccomp_missing() -> str | None:
    """Why filters cannot be built here (libseccomp's Python binding or library missing), or None."""
    try:
        import pyseccomp  # noqa: F401  (ctypes over the system's libseccomp.so.2)
    except (ImportError, OSError) as exc:
        return f"libseccomp is not usable ({type(exc).__name__}: {exc}; Debian: apt-get install libseccomp2)"
    return None


def known(name: str) -> bool:
    """Whether this libseccomp knows ``name`` as a system call of this machine's architecture."""
    import pyseccomp as sc

    try:
        return int(sc.resolve_syscall(sc.system_arch(), name)) >= 0
    except ValueError:
        return False


def _compile(default: int, rules: Iterable[Rule]) -> bytes:
    """A BPF program: each rule's action where it matches, ``default`` (``ALLOW`` or an errno) elsewhere. Names
    this libseccomp does not know are skipped: the default covers their numbers."""
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW if default == ALLOW else sc.ERRNO(default))
    flt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)  # a binary tree: each call costs log(rules), not a walk of them all
    for action, name, conditions in rules:
        if known(name):
            flt.add_rule(sc.ALLOW if action == ALLOW else sc.ERRNO(action), name, *conditions)
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


def _argument_rules() -> list[Rule]:
    """The calls allowed for some arguments only (see the module's docstring)."""
    import pyseccomp as sc

    def low(index: int, value: int) -> object:
        return sc.Arg(index, sc.MASKED_EQ, INT, value)

    # clone: the kernel reads the flags' low 32 bits, where every namespace flag is, so the mask is the width
    rules: list[Rule] = [(ALLOW, "clone", (sc.Arg(0, sc.MASKED_EQ, CLONE_NAMESPACES, 0),))]
    rules += [(errno.EPERM, "clone", (sc.Arg(0, sc.MASKED_EQ, 1 << bit, 1 << bit),)) for bit in _bits(CLONE_NAMESPACES)]
    for call in ("socket", "socketpair"):
        for family in range(AF_MAX):
            rules.append((ALLOW if family in SOCKET_FAMILIES else errno.EAFNOSUPPORT, call, (low(0, family),)))
    rules += [(ALLOW, "ioctl", (low(1, request),)) for request in IOCTLS.values()]
    rules += [(ALLOW, "prctl", (low(0, option),)) for option in PRCTL_OPTIONS.values()]
    rules.append((ALLOW, "fallocate", (low(1, 0),)))
    return rules


def _bits(mask: int) -> list[int]:
    return [bit for bit in range(64) if mask >> bit & 1]


@functools.cache
def boundary_filter() -> bytes:
    """The run's main filter (see the module's docstring), as a BPF program for bubblewrap's ``--seccomp``."""
    rules: list[Rule] = [(ALLOW, name, ()) for names in ALLOWED.values() for name in names]
    rules += [(errno.EPERM, name, ()) for names in DENIED.values() for name in names]
    rules += _argument_rules()
    return _compile(errno.ENOSYS, rules)


@functools.cache
def exec_filter() -> bytes:
    """No more programs: the filter the child loads once its interpreter runs (see the module's docstring)."""
    return _compile(ALLOW, [(errno.EPERM, name, ()) for name in EXEC_CALLS])
