"""Which system calls sandboxed interpreters make: the measurement behind the sandbox's seccomp allow-list.

Runs a command under ``strace -f`` and counts the system calls of every sandboxed interpreter it starts (the
processes whose ``execve`` carries the sandbox's marker, from that ``execve`` on, their threads and children
included), however the call ended: a call the filter refuses is still seen (ptrace stops before seccomp). It
prints each call with how many processes made it, the values of the arguments the filter checks, and marks
the calls the allow-list refuses on purpose (``REFUSED``) and those it lacks (``MISSING``).

    python scripts/sandbox_syscalls.py -- python -m pytest tests/tools/test_sandbox.py -q
    python scripts/sandbox_syscalls.py --workload numpy --workload sympy
    python scripts/sandbox_syscalls.py --workload stdlib --json calls.json

``--workload NAME`` runs one of :data:`WORKLOADS` in a ``PythonSandbox`` (with site-packages, with and without
the audit hook); any other code is measured by putting it in a file and running ``--code FILE``. Needs
``strace`` (Debian: ``apt-get install strace``) and the whole sandbox boundary (run it as the trainer would).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from lit_agentrl.tools.sandbox.allowed import ALLOWED_NAMES, DENIED, FALLBACK

LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*?)(?:= (-?\d+|\?)\b.*)?$")
SPAWNS = {"clone", "clone3", "fork", "vfork"}
RULED = {"ioctl": 1, "prctl": 0, "fcntl": 1, "socket": 0, "clone": 1, "madvise": 2, "mbind": 2, "kill": 1}
"""Calls whose argument (by its place in strace's text) the filter may check: the values seen are listed."""
LOADS_FILTER = re.compile(
    r"^\d+\s+(prctl\(PR_SET_SECCOMP, SECCOMP_MODE_FILTER|seccomp\(SECCOMP_SET_MODE_FILTER), .*\{len="
)
"""A process loading a seccomp filter: from here on, its calls (and its children's) are what the filter must allow."""

STDLIB_SECTIONS = [
    """
import asyncio, bz2, concurrent.futures, csv, datetime, decimal, fractions, gzip, hashlib, io, json, locale
import lzma, math, mmap, os, pathlib, pickle, platform, random, re, secrets, select, selectors, shutil, socket
import sqlite3, statistics, struct, tarfile, tempfile, textwrap, threading, time, unicodedata, zipfile
import zlib, zoneinfo, fcntl, resource, traceback, string, itertools, functools, heapq, bisect, uuid, base64
os.makedirs("d/e", exist_ok=True); pathlib.Path("d/e/f.txt").write_text("hello"); open("h.txt", "w").write("x")
print(sorted(os.listdir("d")), [p.name for p in os.scandir("d")], list(os.walk("d")), os.stat("d").st_mode)
""",
    """shutil.copy2("d/e/f.txt", "g.txt"); shutil.copytree("d", "d2"); shutil.move("g.txt", "g2.txt")""",
    """shutil.rmtree("d2")""",
    """os.symlink("h.txt", "l"); print(os.readlink("l"), os.path.realpath("l")); os.link("h.txt", "k"); os.unlink("k")""",
    """
os.rename("h.txt", "i.txt"); os.replace("i.txt", "j.txt"); os.chmod("j.txt", 0o600); os.utime("j.txt", (1, 1))
os.truncate("j.txt", 2); fd = os.open("j.txt", os.O_RDWR); os.fsync(fd); os.posix_fallocate(fd, 0, 4096)
os.set_blocking(fd, False); fcntl.flock(fd, fcntl.LOCK_EX); fcntl.fcntl(fd, fcntl.F_GETFL); os.lseek(fd, 0, 0)
print(os.pread(fd, 2, 0), os.fstat(fd).st_size, os.dup(fd), os.isatty(fd), os.statvfs(".").f_bsize); os.close(fd)
""",
    """
print(os.getpid(), os.getppid(), os.getuid(), os.getgid(), os.geteuid(), os.getgroups(), os.umask(0o22), os.uname())
print(os.cpu_count(), os.sched_getaffinity(0), os.getloadavg(), os.times())
print(os.urandom(4), secrets.token_hex(4), random.random(), uuid.uuid4(), time.time(), time.monotonic())
print(time.process_time(), time.thread_time(), time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF))
print(resource.getrlimit(resource.RLIMIT_NOFILE), datetime.datetime.now(zoneinfo.ZoneInfo("Europe/Paris")))
time.sleep(0.01); os.sched_yield(); print(locale.getlocale(), platform.platform(), shutil.get_terminal_size())
""",
    """
r, w = os.pipe(); os.write(w, b"x"); print(os.read(r, 1), select.select([r], [], [], 0)); os.close(r); os.close(w)
p = select.poll(); p.register(0); p.poll(0); e = select.epoll(); e.close()
""",
    """
with open("big.bin", "wb") as f:
    f.write(os.urandom(1 << 16))
shutil.copyfile("big.bin", "big2.bin"); print(hashlib.sha256(pathlib.Path("big2.bin").read_bytes()).hexdigest())
with open("big.bin", "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
    print(m[:2])
for mod, ext in ((gzip, "gz"), (bz2, "bz2"), (lzma, "xz")):
    with mod.open("c." + ext, "wb") as f:
        f.write(b"data" * 100)
with zipfile.ZipFile("z.zip", "w") as z:
    z.write("big.bin")
with tarfile.open("t.tar.gz", "w:gz") as t:
    t.add("d")
""",
    """
db = sqlite3.connect("db.sqlite"); db.execute("create table t(x)"); db.execute("insert into t values (1)"); db.commit()
print(db.execute("select * from t").fetchall(), sqlite3.connect(":memory:").execute("select 1").fetchone())
""",
    """
with tempfile.TemporaryDirectory() as tmp, tempfile.NamedTemporaryFile() as tf:
    tf.write(b"x"); print(os.listdir(tmp), tempfile.gettempdir())
""",
    """
with concurrent.futures.ThreadPoolExecutor(2) as pool:
    print(list(pool.map(abs, [-1, -2, -3])))
t = threading.Thread(target=abs, args=(5,)); t.start(); t.join(); ev = threading.Event(); ev.set(); ev.wait(1)
""",
    """
async def main():
    await asyncio.sleep(0.01); q = asyncio.Queue(); await q.put(1)
    return await asyncio.gather(asyncio.to_thread(sum, [1, 2]), q.get())
print(asyncio.run(main()))
""",
    """
for family in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):
    socket.socket(family, socket.SOCK_STREAM).close()
a, b = socket.socketpair(); a.sendall(b"hi"); print(b.recv(2)); a.close(); b.close()
""",
    """
srv = socket.create_server(("127.0.0.1", 0)); cli = socket.create_connection(srv.getsockname(), timeout=2)
conn, _ = srv.accept(); cli.sendall(b"ok"); print(conn.recv(2), socket.gethostname())
""",
    """print(socket.getaddrinfo("localhost", 80)[:1])""",
    """
import multiprocessing
with multiprocessing.get_context("fork").Pool(2) as pool:
    print(pool.map(abs, [-1, -2]))
""",
    """
pid = os.fork()
if pid == 0:
    os._exit(3)
print(os.waitpid(pid, 0))
""",
    """import subprocess; print(subprocess.run(["true"]).returncode)""",
    """
print(json.dumps({"a": [1, 2]}), pickle.loads(pickle.dumps({1: 2})), decimal.Decimal(1) / 7, fractions.Fraction(1, 3))
print(statistics.mean([1, 2, 3]), unicodedata.name("a"), textwrap.shorten("a b c d", 5), re.sub("a", "b", "aa"))
print(struct.pack("i", 1), zlib.crc32(b"x"), base64.b64encode(b"x"), csv.writer(io.StringIO()).writerow([1, 2]))
try:
    1 / 0
except ZeroDivisionError:
    traceback.print_exc(file=sys.stdout)
""",
    """
import ctypes, ssl, email, http.client, urllib.request, xml.etree.ElementTree, logging, getpass
logging.getLogger().warning("log"); print(ctypes.sizeof(ctypes.c_long), ssl.OPENSSL_VERSION[:7])
print(ssl.create_default_context().verify_mode, getpass.getuser())
""",
]
"""The standard library's ways to reach the kernel (files, time, threads, processes, sockets, compression)."""
STDLIB = f"import sys\nfor section in {STDLIB_SECTIONS!r}:\n" + (
    "    try:\n        exec(section, globals())\n"
    "    except Exception as exc:  # refused (by the hook, or the kernel): the next section runs on\n"
    "        print('refused:', type(exc).__name__, exc)\n"
)

WORKLOADS = {
    "print": "print(1)\n",
    "numpy": """
import numpy as np
rng = np.random.default_rng(0)
a = rng.standard_normal((200, 200))
print(np.linalg.solve(a, a.sum(1))[:2], np.linalg.eigvals(a)[:2], np.linalg.svd(a)[1][:2])
print(np.fft.fft(a[0])[:2], np.linalg.inv(a).trace(), np.linalg.det(a[:20, :20]))
np.save("a.npy", a); print(np.load("a.npy").shape)
m = np.memmap("m.bin", dtype="float64", mode="w+", shape=(1000,)); m[:] = 1; m.flush(); del m
print(np.fromfile("m.bin").sum(), np.einsum("ij,jk->ik", a, a).shape, np.sort(rng.integers(0, 9, 50))[:5])
import numpy.polynomial, numpy.ma, numpy.random
print(np.polynomial.Polynomial([1, 2, 3]).roots(), np.ma.masked_array([1, 2], [0, 1]).sum())
""",
    "sympy": """
import sympy as sp
x, y = sp.symbols("x y")
print(sp.solve(x**2 - 2, x), sp.integrate(sp.sin(x) * sp.exp(x), x), sp.simplify(sp.sin(x)**2 + sp.cos(x)**2))
print(sp.series(sp.cos(x), x, 0, 6), sp.limit(sp.sin(x) / x, x, 0), sp.factorint(2**64 - 1))
print(sp.Matrix([[1, 2], [3, 4]]).inv(), sp.dsolve(sp.Derivative(sp.Function("f")(x), x) - sp.Function("f")(x)))
print(sp.nsimplify(0.333333333333), sp.latex(sp.Integral(x**2, x)), sp.N(sp.pi, 50), sp.isprime(2**61 - 1))
f = sp.lambdify(x, sp.sin(x) + x**2, "math"); print(f(1.0), sp.solve([x + y - 3, x - y - 1], [x, y]))
""",
    "stdlib": STDLIB,
    "torch": """
import torch, scipy.linalg
a = torch.randn(64, 64)
print(torch.linalg.inv(a).shape, (a @ a).sum().item() != 0, scipy.linalg.expm(a.numpy()[:4, :4]).shape)
""",
}
"""Ordinary workloads: what model code does with the standard library, numpy and sympy."""

RUNNER = """
import sys
from pathlib import Path
from lit_agentrl.tools.sandbox import PythonSandbox, SandboxLimits
limits = SandboxLimits(cpu_seconds=20, wall_seconds=120, memory_mb=1024, output_bytes=8192, max_processes=16)
for path in sys.argv[1:]:
    for hook in (True, False):
        sandbox = PythonSandbox(limits, site_packages=True)
        sandbox._guard = hook
        result = sandbox.run(Path(path).read_text())
        print(path, "hook" if hook else "no hook", result.error or "ok", result.stdout[-3000:], file=sys.stderr)
"""


def trace(command: list[str], log: Path) -> int:
    """Run ``command`` under ``strace -f`` writing ``log``; its exit status."""
    strace = ["strace", "-f", "-qq", "-v", "-s", "200", "-o", str(log), "--"]
    return subprocess.run([*strace, *command], check=False).returncode


def sandboxed_calls(log: Path) -> tuple[dict[str, set[int]], dict[str, collections.Counter[str]]]:
    """Each system call made under a filter (the pids making it), and the values of :data:`RULED` arguments."""
    tracked: set[int] = set()
    calls: dict[str, set[int]] = collections.defaultdict(set)
    values: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with log.open(errors="replace") as lines:
        for line in lines:
            match = LINE.match(line)
            if match is None:
                continue
            pid, name, result = int(match[1]), match[2] or match[3], match[5]
            if LOADS_FILTER.search(line):
                tracked.add(pid)
            if pid not in tracked:
                continue
            calls[name].add(pid)
            if name in RULED and match[3]:
                arguments = match[4].split(", ")
                if len(arguments) > RULED[name]:
                    values[name][re.split(r"[) ]", arguments[RULED[name]], maxsplit=1)[0]] += 1
            if name in SPAWNS and result is not None and result.isdigit() and int(result) > 0:
                tracked.add(int(result))
    return calls, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", action="append", default=[], choices=sorted(WORKLOADS))
    parser.add_argument("--code", action="append", default=[], type=Path, help="a file of code to run sandboxed")
    parser.add_argument("--json", type=Path, help="also write {call: number of processes} here")
    parser.add_argument("--log", type=Path, help="keep strace's log here (or, with --read, read it)")
    parser.add_argument("--read", action="store_true", help="only read --log, written by an earlier call")
    parser.add_argument("command", nargs="*", help="a command that runs sandboxes (after --)")
    args = parser.parse_args()
    status = 0
    with tempfile.TemporaryDirectory(prefix="lit-agentrl-trace-") as tmp:
        log = args.log or Path(tmp, "strace.log")
        files = [str(p.resolve()) for p in args.code]
        for name in args.workload:
            files.append(str(Path(tmp, f"{name}.py")))
            Path(files[-1]).write_text(WORKLOADS[name])
        if not args.read:
            if not args.command and not files:
                parser.error("give --workload, --code or a command")
            status = trace(args.command or [sys.executable, "-c", RUNNER, *files], log)
        calls, values = sandboxed_calls(log)
    if not calls:
        sys.exit(f"no process under a seccomp filter was seen (exit status {status})")
    for name in sorted(calls):
        shown = ", ".join(f"{v} ({n})" for v, n in values[name].most_common()) if name in values else ""
        print(f"{name:24s} {len(calls[name]):5d}  {_verdict(name):8s} {shown}")
    if args.json:
        table = {
            name: {"processes": len(pids), "arguments": dict(values.get(name, {}))} for name, pids in calls.items()
        }
        args.json.write_text(json.dumps(dict(sorted(table.items())), indent=1))
    missing = [name for name in calls if _verdict(name) == "MISSING"]
    print(f"exit status {status}; {len(calls)} calls, {len(missing)} missing: {' '.join(missing)}", file=sys.stderr)


def _verdict(name: str) -> str:
    """Allowed (blank), refused on purpose (``REFUSED``: denied, or ``ENOSYS`` for a fallback), or ``MISSING``."""
    if name in ALLOWED_NAMES:
        return ""
    denied = any(name in names for names in DENIED.values()) or name in FALLBACK
    return "REFUSED" if denied else "MISSING"


if __name__ == "__main__":
    main()
