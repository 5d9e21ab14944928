"""Run model-written Python code in a separate, limited process: :class:`PythonSandbox`.

Each run gets a fresh interpreter (``python -I -S -B``) in a new session (its own process group), in a
fresh temporary working directory that is deleted afterwards, with a minimal environment (nothing of the
trainer's: no ``PATH`` into the project, no ``HOME``, no ``WANDB_*``/``HF_*`` tokens), stdin on
``/dev/null``, no inherited file descriptors, and the limits of :class:`SandboxLimits`. At most
``output_bytes`` of stdout and of stderr are kept; the rest is read and discarded, so neither a blocked pipe
nor a flood of output reaches the trainer's memory.

Model code never makes :meth:`PythonSandbox.run` / :meth:`PythonSandbox.arun` raise: syntax errors,
exceptions, timeouts, limits and refused operations all come back as a :class:`SandboxResult`, whose
:meth:`SandboxResult.as_tool_text` is what the model is shown. Anything with
``async def arun(code) -> SandboxResult`` is a :class:`CodeRunner`, e.g. a remote sandbox service's client.

What the isolation protects against, layer by layer, and what it does not: docs/sandbox.md. The modules:

* :mod:`.limits`: :class:`SandboxLimits`, :func:`limits_from_mapping`;
* :mod:`.results`: :class:`SandboxResult`, :class:`CodeRunner`, output capture, exit status to result;
* :mod:`.runner`: :class:`PythonSandbox` (probing, preparing, launching, waiting, killing);
* :mod:`.processes`: the host side (per-run uid, killing leftovers, deleting the run's folder);
* :mod:`.stage1`, :mod:`.rootfs`, :mod:`.stage2`, :mod:`.guard`: the child's code, which the child gets as
  text (it cannot import the project): stage 1 sets limits, enters network, mount and PID namespaces, builds
  the run's own minimal root (:mod:`.rootfs`: the kernel-enforced file-system boundary), drops privileges and
  ``exec``\\ s stage 2, which installs the guard (the audit hook, the second layer) and runs the code.
"""

from lit_agentrl.tools.sandbox.limits import SandboxLimits, limits_from_mapping
from lit_agentrl.tools.sandbox.results import CodeRunner, SandboxResult
from lit_agentrl.tools.sandbox.runner import PythonSandbox

__all__ = ["CodeRunner", "PythonSandbox", "SandboxLimits", "SandboxResult", "limits_from_mapping"]
