"""What one sandboxed run may use: :class:`SandboxLimits`, and :func:`limits_from_mapping` for configs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["SandboxLimits", "limits_from_mapping"]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    cpu_seconds: float = 5.0
    """CPU time (``RLIMIT_CPU``, rounded up to whole seconds): SIGXCPU at the limit, SIGKILL a second later."""
    wall_seconds: float = 10.0
    """Wall-clock time from start; then the child's whole process group is killed (``timed_out``)."""
    memory_mb: int = 512
    """Address space (``RLIMIT_AS``): a bigger allocation raises ``MemoryError`` in the code."""
    output_bytes: int = 16_384
    """Bytes kept of stdout (its beginning) and of stderr (its end, where tracebacks are); the rest is
    read and discarded (``truncated`` is set and the kept text says how much was dropped)."""
    max_processes: int = 0
    """Extra processes/threads the code may create. 0: none (``os.fork`` refused by the audit hook, and
    ``RLIMIT_NPROC`` where the kernel enforces it: not for root, hence the privilege drop). Above 0,
    ``os.fork`` is allowed, limited by ``RLIMIT_NPROC`` (uid-wide, see docs/sandbox.md);
    running other programs stays refused, and leftovers are killed by process group and by command line."""
    file_size_mb: int = 16
    """Largest file the code may write (``RLIMIT_FSIZE``)."""

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "output_bytes", "file_size_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")
        if self.max_processes < 0:
            raise ValueError(f"SandboxLimits.max_processes must be >= 0, got {self.max_processes!r}")


def limits_from_mapping(mapping: Any) -> SandboxLimits:
    """``SandboxLimits`` from a mapping (e.g. the agent YAML's ``sandbox:``); unknown keys are an error."""
    if mapping is None:
        return SandboxLimits()
    if hasattr(mapping, "items"):
        values = {str(k): v for k, v in mapping.items()}
    else:
        raise TypeError(f"sandbox limits must be a mapping of SandboxLimits fields, got {type(mapping).__name__}")
    known = set(asdict(SandboxLimits()))
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown sandbox limit(s) {unknown}; the fields are {sorted(known)}")
    return SandboxLimits(**values)
