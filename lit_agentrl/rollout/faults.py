"""Faults that fail the trajectory they happen in, even when the agent's own code catches the exception.

Agents often wrap tool calls in a bare ``except:`` and tell the model "tool execute error" (the seed's examples do),
which is right for the model's mistakes and wrong for a broken set-up: a run would train on trajectories whose every
tool call failed for a reason no model can fix, and exit 0. Code that detects such a fault calls
:func:`report_fault` before it raises; the rollout manager fails the trajectory with that reason whatever the agent
did with the exception (``rollout/num_failed``, ``failure_reasons``).
"""

from __future__ import annotations

from contextvars import ContextVar

TRAJECTORY_FAULTS: ContextVar[list[str] | None] = ContextVar("lit_agentrl_trajectory_faults", default=None)
"""The faults reported in the running trajectory (the rollout manager sets a fresh list for each trajectory)."""


class TrajectoryFault(RuntimeError):
    """A trajectory failed by a reported fault."""


def report_fault(reason: str) -> None:
    """Fail the running trajectory with ``reason`` once its agent returns (no-op outside a rollout)."""
    faults = TRAJECTORY_FAULTS.get()
    if faults is not None:
        faults.append(reason)


def raise_reported_faults(faults: list[str]) -> None:
    """``TrajectoryFault`` naming the first reported fault (and how many there were), if any."""
    if faults:
        more = f" (and {len(faults) - 1} more)" if len(faults) > 1 else ""
        raise TrajectoryFault(f"{faults[0]}{more}")
