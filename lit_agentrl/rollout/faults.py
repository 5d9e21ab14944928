"""Faults that fail the trajectory they happen in, even when the agent's own code catches the exception.

Agents often wrap tool calls in a bare ``except:`` and tell the model "tool execute error" (the seed's examples do),
which is right for the model's mistakes and wrong for a broken set-up: a run would train on trajectories whose every
tool call failed for a reason no model can fix, and exit 0. Code that detects such a fault calls
:func:`lit_agentrl.context.report_fault` before it raises; the rollout manager fails the trajectory with that reason whatever the agent
did with the exception (``rollout/num_failed``, ``failure_reasons``). The faults are the running trajectory's
(:mod:`lit_agentrl.context`).
"""

from __future__ import annotations


class TrajectoryFault(RuntimeError):
    """A trajectory failed by a reported fault."""


def raise_reported_faults(faults: list[str]) -> None:
    """``TrajectoryFault`` naming the first reported fault (and how many there were), if any."""
    if faults:
        more = f" (and {len(faults) - 1} more)" if len(faults) > 1 else ""
        raise TrajectoryFault(f"{faults[0]}{more}")
