"""The seccomp filter is an allow-list: raw system calls the list lacks are refused, in every mode of the sandbox.

Each attack is a raw ``syscall(2)`` through ctypes (every argument a full 64-bit ``long``, so the register holds
exactly what the attacker chose): socket families hidden in the upper 32 bits the kernel ignores, families
other than local, IPv4 and IPv6, calls newer than this machine's libseccomp (called by number), AIO, the LDT,
the mount family, keyrings, bpf, ptrace, userfaultfd, perf, namespace flags on ``clone``, ``ioctl(TIOCSTI)``
with high bits, and ``fallocate`` modes. They run with the audit hook and without it, without site-packages
(ctypes refused by the hook) and with them (ctypes importable, as numpy and sympy need), against the whole
boundary: nothing may succeed, and where ctypes runs the refusal must be the filter's own errno (the kernel
without the filter answers otherwise: ``EPERM`` for a missing capability, ``EINVAL`` or success). A call of the
x32 or i386 ABI kills the run. numpy and sympy still run under the list.

The numbers are x86-64's: elsewhere these tests skip.
"""

from __future__ import annotations

import errno
import platform
import subprocess
import sys
import uuid

import pytest

from lit_agentrl.tools.sandbox import PythonSandbox, SandboxLimits, allowed, syscalls

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the system-call numbers are x86-64's"),
]

LIMITS = SandboxLimits(cpu_seconds=5, wall_seconds=30, output_bytes=8192)
ESCAPED = f"ESCAPED{uuid.uuid4().hex}"
HIGH = 1 << 32
"""A bit the kernel ignores in an ``int`` argument: a filter comparing 64 bits sees another value."""

AF_UNIX, AF_NETLINK, AF_PACKET, AF_VSOCK, AF_XDP = 1, 16, 17, 40, 44
SOCK_STREAM, SOCK_RAW = 1, 3
CLONE_NEWNET, CLONE_NEWUSER, SIGCHLD = 0x40000000, 0x10000000, 17
TIOCSTI, FALLOC_FL_KEEP_SIZE = 0x5412, 1
PR_SET_MM, PR_SET_PTRACER = 35, 0x59616D61

ATTACKS: dict[str, tuple[int, tuple[int, ...], int]] = {
    # name: (x86-64 number, arguments, the filter's errno)
    "socket AF_NETLINK | 1<<32": (41, (AF_NETLINK | HIGH, SOCK_RAW, 0), errno.EAFNOSUPPORT),
    "socket AF_VSOCK | 1<<32": (41, (AF_VSOCK | HIGH, SOCK_STREAM, 0), errno.EAFNOSUPPORT),
    "socket AF_VSOCK": (41, (AF_VSOCK, SOCK_STREAM, 0), errno.EAFNOSUPPORT),
    "socket AF_PACKET": (41, (AF_PACKET, SOCK_RAW, 0x0300), errno.EAFNOSUPPORT),
    "socket AF_XDP": (41, (AF_XDP, SOCK_RAW, 0), errno.EAFNOSUPPORT),
    "socket family 1<<16 | AF_NETLINK": (41, (1 << 16 | AF_NETLINK, SOCK_RAW, 0), errno.ENOSYS),
    "socketpair AF_NETLINK | 1<<32": (53, (AF_NETLINK | HIGH, SOCK_RAW, 0, 0), errno.EAFNOSUPPORT),
    "statmount (457, newer than libseccomp 2.5.4)": (457, (0, 0, 0, 0), errno.ENOSYS),
    "listmount (458, newer than libseccomp 2.5.4)": (458, (0, 0, 0, 0), errno.ENOSYS),
    "setxattrat (463)": (463, (0, 0, 0, 0, 0, 0), errno.ENOSYS),
    "open_tree_attr (467)": (467, (-100, 0, 0, 0, 0), errno.ENOSYS),
    "file_getattr (468)": (468, (-100, 0, 0, 0, 0), errno.ENOSYS),
    "a number no kernel has (1000)": (1000, (), errno.ENOSYS),
    "cachestat": (451, (0, 0, 0, 0), errno.EPERM),
    "io_setup": (206, (1, 0), errno.EPERM),
    "io_uring_setup": (425, (1, 0), errno.EPERM),
    "modify_ldt": (154, (0, 0, 16), errno.EPERM),
    "mount": (165, (0, 0, 0, 0, 0), errno.EPERM),
    "keyctl": (250, (0, -3, 0, 0, 0), errno.EPERM),
    "bpf": (321, (0, 0, 0), errno.EPERM),
    "ptrace PTRACE_TRACEME": (101, (0, 0, 0, 0), errno.EPERM),
    "userfaultfd": (323, (0,), errno.EPERM),
    "perf_event_open": (298, (0, 0, -1, -1, 0), errno.EPERM),
    "unshare CLONE_NEWUSER": (272, (CLONE_NEWUSER,), errno.EPERM),
    "clone CLONE_NEWNET": (56, (CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0), errno.EPERM),
    "clone CLONE_NEWUSER | 1<<32": (56, (CLONE_NEWUSER | HIGH | SIGCHLD, 0, 0, 0, 0), errno.EPERM),
    "ioctl TIOCSTI | 1<<32": (16, (0, TIOCSTI | HIGH, 0), errno.ENOSYS),
    "prctl PR_SET_MM": (157, (PR_SET_MM, 0, 0, 0, 0), errno.ENOSYS),
    "prctl PR_SET_PTRACER | 1<<32": (157, (PR_SET_PTRACER | HIGH, 0, 0, 0, 0), errno.ENOSYS),
    "personality PER_LINUX32": (135, (8,), errno.EPERM),
    "fallocate KEEP_SIZE | 1<<32": (285, (-1, FALLOC_FL_KEEP_SIZE | HIGH, 0, 4096), errno.ENOSYS),
}
"""Each attack: the call, its arguments, and the errno the filter answers with."""

RAW = """
import os, sys
def call(number, args):
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        fd = os.open("scratch", os.O_CREAT | os.O_RDWR, 0o600)
        args = [fd if a == -1 and number == 285 else a for a in args]  # fallocate on a file of the run's own
        got = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
        if got == 0 and number == 56:
            os._exit(0)  # a clone that worked: the child leaves at once
    except BaseException as e:
        return "refused by the hook: " + type(e).__name__
    return "errno %d" % ctypes.get_errno() if got < 0 else "succeeded"
for name, (number, args) in CALLS.items():
    result = call(number, args)
    print(name, "->", result)
    if result == "succeeded" and not MAY_SUCCEED:
        print(ESCAPED, name)
print("DONE")
"""

MODES = {
    "hook": (True, False),
    "kernel layers alone": (False, False),
    "hook, site-packages": (True, True),
    "kernel layers alone, site-packages": (False, True),
}
"""(audit hook, site_packages): with site-packages ctypes is importable, as numpy and sympy need."""


def _sandbox(mode: str, limits: SandboxLimits = LIMITS) -> PythonSandbox:
    hook, site = MODES[mode]
    sandbox = PythonSandbox(limits, site_packages=site)
    sandbox._guard = hook
    return sandbox


def _program(attacks: dict[str, tuple[int, tuple[int, ...], int]], may_succeed: bool = False) -> str:
    calls = {name: (number, args) for name, (number, args, _) in attacks.items()}
    return f"CALLS = {calls!r}\nESCAPED = {ESCAPED!r}\nMAY_SUCCEED = {may_succeed}\n" + RAW


@pytest.mark.usefixtures("sandbox_boundary")
@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_attack_is_refused_by_the_filter(mode):
    result = _sandbox(mode).run(_program(ATTACKS))
    assert ESCAPED not in result.stdout, result.stdout
    assert result.stdout.endswith("DONE\n"), result.stdout + str(result.error)
    answers = dict(line.split(" -> ") for line in result.stdout.splitlines()[:-1])
    assert set(answers) == set(ATTACKS)
    for name, (_, _, expected) in ATTACKS.items():
        if not answers[name].startswith("refused by the hook"):  # else ctypes never ran: the hook held
            assert answers[name] == f"errno {expected}", f"{name}: {answers[name]} (want {errno.errorcode[expected]})"
    if not MODES[mode][0]:  # without the hook ctypes always runs: the filter answered every call
        assert not any(answer.startswith("refused by the hook") for answer in answers.values()), answers


I386 = """
def call():
    try:
        import ctypes, mmap
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(bytes.fromhex("b814000000cd80c3"))  # mov eax, 20 (getpid); int 0x80; ret
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        return ctypes.CFUNCTYPE(ctypes.c_int)(address)()
    except BaseException as e:
        return "refused by the hook: " + type(e).__name__
print("getpid through i386 ->", call())
"""


@pytest.mark.usefixtures("sandbox_boundary")
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("abi", ["x32", "i386"])
def test_a_call_of_another_abi_kills_the_run(mode, abi):
    """x32 (the x86-64 number with bit 30) and i386 (``int 0x80``) calls are not filtered by the x86-64 rules:
    libseccomp's action for a foreign architecture kills the process."""
    if abi == "x32":
        code = _program({"getpid through x32": (0x40000000 | 39, (), 0)}).replace('print("DONE")', "")
    else:
        code = I386
    result = _sandbox(mode).run(code + "print('after')")
    if MODES[mode][0] and f"getpid through {abi} -> refused by the hook" in result.stdout:
        return  # the hook refused what ctypes needed: the call was never made
    assert f"getpid through {abi} ->" not in result.stdout and "after" not in result.stdout, result
    assert result.error is not None and "SIGSYS" in result.error, result  # killed in the call


@pytest.mark.usefixtures("sandbox_boundary")
def test_what_the_list_allows_still_works():
    """The kernel's own width: ``AF_UNIX | 1<<32`` is a local socket to the kernel, so the filter allows it; so
    it does the ordinary calls of sockets and threads (the hook, off here, would refuse the socket itself)."""
    code = _program({"socket AF_UNIX | 1<<32": (41, (AF_UNIX | HIGH, SOCK_STREAM, 0), 0)}, may_succeed=True)
    code += "import socket, threading\na, b = socket.socketpair(); a.sendall(b'x'); print('pair', b.recv(1))\n"
    code += "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=30, max_processes=2)
    result = _sandbox("kernel layers alone", limits).run(code)
    assert result.error is None, result
    assert result.stdout == "socket AF_UNIX | 1<<32 -> succeeded\nDONE\npair b'x'\nthread\n"


NUMPY = """
import numpy as np
a = np.random.default_rng(0).standard_normal((64, 64))
print("solve", np.allclose(a @ np.linalg.solve(a, a.sum(1)), a.sum(1)), "fft", np.fft.fft(a[0]).shape)
np.save("a.npy", a); print("load", np.load("a.npy").shape)
"""
SYMPY = """
import sympy as sp
x = sp.symbols("x")
print("solve", sp.solve(x**2 - 2, x), "integrate", sp.integrate(sp.sin(x) * sp.exp(x), x))
"""


@pytest.mark.usefixtures("sandbox_boundary")
@pytest.mark.parametrize("hook", [True, False], ids=["hook", "kernel layers alone"])
def test_numpy_and_sympy_run_under_the_allow_list(hook):
    pytest.importorskip("numpy")
    pytest.importorskip("sympy")
    sandbox = PythonSandbox(SandboxLimits(cpu_seconds=30, wall_seconds=120, memory_mb=1024), site_packages=True)
    sandbox._guard = hook
    result = sandbox.run(NUMPY)
    assert result.error is None and result.stdout == "solve True fft (64,)\nload (64, 64)\n", result
    result = sandbox.run(SYMPY)
    assert result.error is None, result
    assert result.stdout == "solve [-sqrt(2), sqrt(2)] integrate exp(x)*sin(x)/2 - exp(x)*cos(x)/2\n"


# ----------------------------------------------------------------- the lists, and the filter without the sandbox


def _need_libseccomp() -> None:
    reason = syscalls.seccomp_missing()
    if reason:
        pytest.skip(reason)


def test_the_allow_list_and_the_deny_list_do_not_meet():
    denied = {name for names in allowed.DENIED.values() for name in names}
    assert not allowed.ALLOWED_NAMES & denied
    assert not set(allowed.FALLBACK) & allowed.ALLOWED_NAMES


def test_every_allowed_name_is_a_system_call_libseccomp_knows():
    _need_libseccomp()
    assert [name for name in sorted(allowed.ALLOWED_NAMES) if not syscalls.known(name)] == []


FILTER_ALONE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
program = bytes.fromhex(sys.argv[1])
class Prog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))
buffer = ctypes.create_string_buffer(program, len(program))
prog = Prog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0
def call(number, *args):
    got = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
    return 0 if got >= 0 else ctypes.get_errno()
print(call(41, 16 | 1 << 32, 3, 0), call(41, 1 | 1 << 32, 1, 0), call(458, 0, 0, 0, 0), call(206, 1, 0))
print(call(16, 0, 0x5401 | 1 << 32, 0), call(16, 0, 0x5412 | 1 << 32, 0), call(439, -100, 0, 0, 0) != 38)
"""


def test_the_filter_alone_compares_the_width_the_kernel_reads():
    """Loaded in a plain process (no bubblewrap needed): what the filter answers, and what it lets the kernel
    answer (``AF_UNIX | 1<<32`` opens a socket, ``TCGETS | 1<<32`` on /dev/null gets the kernel's ``ENOTTY``)."""
    _need_libseccomp()
    done = subprocess.run(
        [sys.executable, "-I", "-c", FILTER_ALONE, syscalls.boundary_filter().hex()],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    first, second = (line.split() for line in done.stdout.splitlines())
    assert first == [str(errno.EAFNOSUPPORT), "0", str(errno.ENOSYS), str(errno.EPERM)]
    assert second == [str(errno.ENOTTY), str(errno.ENOSYS), "True"]  # faccessat2 reaches the kernel


def test_the_filter_fits_the_kernels_limit():
    _need_libseccomp()
    program = syscalls.boundary_filter()
    assert len(program) % 8 == 0 and 200 < len(program) // 8 < 4096  # the kernel's limit is 4096 instructions
