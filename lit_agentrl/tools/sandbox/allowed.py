"""The system calls a sandboxed run may make: the seccomp allow-list, and what it must never contain.

How the list was made (docs/sandbox.md, "The seccomp filter", says it at length): ``scripts/sandbox_syscalls.py``
ran the sandbox's tests (tests/tools/test_sandbox.py, test_sandbox_hostile.py, test_sandbox_parts.py,
test_execute_python_code.py) and its own workloads (the standard library's ways to reach the kernel: files,
time, threads, processes, sockets, compression, SQLite, SSL; numpy: linear algebra, FFT, memmap; sympy: solving,
integrating, series; torch and scipy), with and without the audit hook and with site-packages, under
``strace -f``, and listed every call made by a process after it loaded the filter (bubblewrap's PID 1
included: it loads the filter too). Each measured call is here, under what it is for, with
its other numbers for the same thing (``open`` beside ``openat``, ``dup2`` beside ``dup3``, ...), so a Python
built on another C library (musl uses the older numbers) or a newer glibc (``statx``, ``close_range``) runs too.
Measured but left out: the hostile corpus's attacks (:data:`DENIED`), and ``mbind`` (OpenBLAS asks for NUMA
placement and carries on when refused).

To extend it: run your workload under the tracer, read the calls it marks ``MISSING``, and add those that reach
nothing outside the run's namespaces (never one from :data:`DENIED`; a test checks the two lists do not meet).
"""

from __future__ import annotations

__all__ = [
    "ALLOWED",
    "ALLOWED_NAMES",
    "CLONE_NAMESPACES",
    "DENIED",
    "FALLBACK",
    "IOCTLS",
    "PRCTL_OPTIONS",
    "RULED",
    "SOCKET_FAMILIES",
]

ALLOWED: dict[str, tuple[str, ...]] = {
    "the interpreter's start: the dynamic loader and the C library's set-up": (
        *("execve", "arch_prctl", "set_tid_address", "set_robust_list", "rseq", "brk", "uname", "sysinfo"),
        *("prlimit64", "getrlimit", "setrlimit", "getrusage", "times", "capget", "getcpu"),
    ),
    "memory (counted by the cgroup and RLIMIT_AS)": (
        *("mmap", "munmap", "mremap", "mprotect", "madvise", "msync", "mincore"),
        "map_shadow_stack",  # a new thread's shadow stack, where a newer glibc turns on CET shadow stacks
    ),
    "reading and writing descriptors": (
        *("read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2"),
        *("lseek", "close", "close_range", "dup", "dup2", "dup3", "fcntl", "flock", "pipe", "pipe2"),
        *("sendfile", "copy_file_range", "splice", "fadvise64", "readahead", "fsync", "fdatasync", "ftruncate"),
    ),
    "files and folders (what the run's mount namespace shows: its tmpfs, the read-only rest)": (
        *("open", "openat", "creat", "stat", "lstat", "fstat", "newfstatat", "statx", "statfs", "fstatfs"),
        *("access", "faccessat", "faccessat2", "readlink", "readlinkat", "getdents", "getdents64", "getcwd"),
        *("chdir", "fchdir", "umask", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "truncate"),
        *("rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat"),
        *("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat"),
        *("utime", "utimes", "futimesat", "utimensat"),
        *("getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr"),
        *("setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr"),
    ),
    "waiting on descriptors and time": (
        *("poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl"),
        *("epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "signalfd", "signalfd4"),
        *("timerfd_create", "timerfd_settime", "timerfd_gettime", "clock_gettime", "clock_getres"),
        *("clock_nanosleep", "nanosleep", "gettimeofday", "time", "getitimer", "setitimer", "alarm"),
        *("timer_create", "timer_settime", "timer_gettime", "timer_getoverrun", "timer_delete", "getrandom"),
    ),
    "threads and processes (in the run's PID namespace; the cgroup bounds how many)": (
        *("fork", "vfork", "exit", "exit_group", "wait4", "waitid", "futex", "sched_yield"),
        *("sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_getscheduler"),
        *("sched_get_priority_max", "sched_get_priority_min", "getpriority", "setpriority"),
        *("getpid", "getppid", "gettid", "getpgid", "getpgrp", "setpgid", "getsid", "setsid"),
        *("getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid", "getresgid"),
    ),
    "signals (only the run's own processes can be reached)": (
        *("rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigsuspend", "rt_sigpending"),
        *("rt_sigtimedwait", "sigaltstack", "pause", "kill", "tgkill", "tkill"),
    ),
    "sockets (a network namespace with only loopback; socket and socketpair by family, below)": (
        *("bind", "listen", "accept", "accept4", "connect", "shutdown", "getsockname", "getpeername"),
        *("setsockopt", "getsockopt", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg"),
    ),
}
"""Allowed whatever their arguments, by what they are for."""

FALLBACK = ("clone3",)
"""Refused with ``ENOSYS`` (the filter's default) on purpose: the C library then uses ``clone`` (below)."""
RULED = ("clone", "socket", "socketpair", "ioctl", "prctl", "fallocate")
"""Allowed for some arguments only (``syscalls.boundary_filter`` says which). ``clone``'s flags are in a register a
filter can read (``clone3``'s are behind a pointer)."""

CLONE_NAMESPACES = 0x7E020000
"""``CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET``: ``clone`` only without any of them."""
SOCKET_FAMILIES = (1, 2, 10)
"""``AF_UNIX``, ``AF_INET``, ``AF_INET6``: the only socket families (the network namespace has nothing to reach)."""
IOCTLS = {"TCGETS": 0x5401, "TIOCGWINSZ": 0x5413, "FIONREAD": 0x541B, "FIONBIO": 0x5421}
IOCTLS |= {"FIONCLEX": 0x5450, "FIOCLEX": 0x5451}
"""The ioctl requests allowed: is it a terminal and how wide, bytes waiting, non-blocking, close-on-exec."""
PRCTL_OPTIONS = {"PR_GET_DUMPABLE": 3, "PR_SET_DUMPABLE": 4, "PR_SET_NAME": 15, "PR_GET_NAME": 16, "PR_GET_SECCOMP": 21}
PRCTL_OPTIONS |= {"PR_SET_SECCOMP": 22, "PR_CAPBSET_READ": 23, "PR_SET_NO_NEW_PRIVS": 38, "PR_GET_NO_NEW_PRIVS": 39}
PRCTL_OPTIONS |= {"PR_SET_VMA": 0x53564D41}
"""The prctl options allowed: thread names, reading its state, more filters (the child loads its own), whether
a process may be traced or its ``/proc`` files opened by others of its uid (the run's supervisor is not), and
names of its own memory (glibc 2.38 and later name thread stacks and malloc arenas)."""

ALLOWED_NAMES = frozenset(name for names in ALLOWED.values() for name in names) | frozenset(RULED)
"""Every call a run may make (some only with certain arguments)."""

DENIED: dict[str, tuple[str, ...]] = {
    "keyrings (the parent's session keyring, the uid's user keyring)": ("add_key", "keyctl", "request_key"),
    "memory outside the address-space limit, and memory fault handling": (
        *("memfd_create", "memfd_secret", "userfaultfd"),
    ),
    "io_uring and AIO (calls a filter cannot see; a machine-wide pool of AIO slots)": (
        *("io_uring_setup", "io_uring_enter", "io_uring_register", "io_setup", "io_destroy", "io_submit"),
        *("io_getevents", "io_pgetevents", "io_cancel"),
    ),
    "other processes' memory": (
        *("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"),
    ),
    "mounts and namespaces": (
        *("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig"),
        *("fsmount", "fspick", "mount_setattr", "listmount", "statmount", "open_tree_attr", "unshare", "setns"),
    ),
    "files by handle (past every directory's permissions)": ("open_by_handle_at", "name_to_handle_at"),
    "the kernel's programs, counters and watches": (
        *("bpf", "perf_event_open", "fanotify_init", "fanotify_mark", "lookup_dcookie"),
        *("inotify_init", "inotify_init1", "inotify_add_watch"),
    ),
    "System V and POSIX message-queue IPC": (
        *("msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semctl"),
        *("shmget", "shmat", "shmdt", "shmctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive"),
        *("mq_notify", "mq_getsetattr"),
    ),
    "the machine's administration": (
        *("init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot"),
        *("swapon", "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "settimeofday", "clock_settime"),
        *("clock_adjtime", "adjtimex", "ioperm", "iopl", "modify_ldt", "vhangup", "uselib", "sysfs"),
        *("nfsservctl", "sethostname", "setdomainname", "mknod", "mknodat", "sync", "syncfs"),
    ),
    "NUMA memory policy": ("mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages"),
    "identities and personalities": (
        *("setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups"),
        *("setfsuid", "setfsgid", "capset", "personality"),
    ),
    "extended attributes and file attributes by path and descriptor (new calls)": (
        *("setxattrat", "getxattrat", "listxattrat", "removexattrat", "file_getattr", "file_setattr"),
        "cachestat",
    ),
}
"""Calls a run must never make (each refused with ``EPERM``, where this libseccomp knows its number; the filter's
default refuses the others, and every call it does not know, with ``ENOSYS``)."""
