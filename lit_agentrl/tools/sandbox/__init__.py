"""Run model-written Python code in a separate, limited, isolated process: :class:`PythonSandbox`.

Each run gets a fresh interpreter (``python -I -S -B``) inside bubblewrap: new user, PID, network, IPC, UTS and
cgroup namespaces, a uid of its own (as root), no capabilities, a root holding only read-only system and
interpreter folders, and one size-limited ``noexec`` tmpfs for its folder, ``/tmp`` and ``/dev/shm`` that
vanishes with it; a seccomp filter (keyrings, ``memfd``, io_uring, ``ptrace``, mounts, ``open_by_handle_at``,
``bpf``, SysV IPC, ``execve`` once started, ...), a cgroup with memory and task limits, and the limits of
:class:`SandboxLimits`. Where the machine cannot give all of that, :class:`PythonSandbox` refuses to be built
unless ``allow_weak_sandbox=True``. At most ``output_bytes`` of stdout and of stderr are kept; a flood of
output stops the run.

Model code never makes :meth:`PythonSandbox.run` / :meth:`PythonSandbox.arun` raise: syntax errors,
exceptions, timeouts, limits and refused operations all come back as a :class:`SandboxResult`, whose
:meth:`SandboxResult.as_tool_text` is what the model is shown. Anything with
``async def arun(code) -> SandboxResult`` is a :class:`CodeRunner`, e.g. a remote sandbox service's client.

What the isolation protects against, and what it assumes of the machine: docs/sandbox.md. The modules:

* :mod:`.limits`: :class:`SandboxLimits`, :func:`limits_from_mapping`;
* :mod:`.results`: :class:`SandboxResult`, :class:`CodeRunner`, output capture, exit status to result;
* :mod:`.runner`: :class:`PythonSandbox` (probing, preparing, launching, waiting, killing);
* :mod:`.boundary`: bubblewrap's arguments and the launcher that mounts the run's tmpfs;
* :mod:`.syscalls`: the seccomp filters; :mod:`.cgroups`: a cgroup per run;
* :mod:`.processes`: the host side (per-run uid, killing leftovers, deleting a weak run's folder);
* :mod:`.verdict`: what the run's own side reports (its setup, the code's real wait status), on a pipe the code
  cannot write; :mod:`.reaping`: the trainer as a child subreaper, waiting for what a run leaves it;
* :mod:`.stage`, :mod:`.guard`: the child's code, which the child gets as text (it cannot import the project):
  its limits, its last seccomp filter, the audit hook (a second layer), then the code.
"""

from lit_agentrl.tools.sandbox.limits import SandboxLimits, limits_from_mapping
from lit_agentrl.tools.sandbox.results import CodeRunner, SandboxResult
from lit_agentrl.tools.sandbox.runner import PythonSandbox, SandboxUnavailable

__all__ = ["CodeRunner", "PythonSandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "limits_from_mapping"]
