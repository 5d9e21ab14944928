"""The report of a step's failed trajectories: their counts by reason at every step, each reason's traceback once.

A failure that recurs (an untrained vision-language model that sometimes generates the image placeholder, a tool
that times out now and then) would otherwise print the same traceback at every step and bury the run's output; its
count still shows at every step, and the step whose report holds its traceback is named.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from lit_agentrl.display import inert
from lit_agentrl.types import Trajectory

MAX_TRACEBACKS = 8
"""Most reasons whose tracebacks one rank sends for one step (reasons may be many, tracebacks are long)."""


def reason_of(trajectory: Trajectory) -> str:
    """A failed trajectory's reason, as the report counts it."""
    return trajectory.failure_reason or "unknown"


def first_tracebacks(trajectories: Iterable[Trajectory]) -> dict[str, str]:
    """The traceback of the first failed trajectory of each failure reason (at most :data:`MAX_TRACEBACKS`)."""
    tracebacks: dict[str, str] = {}
    for t in trajectories:
        reason = reason_of(t)
        if t.failed and t.failure_traceback and reason not in tracebacks:
            tracebacks[reason] = t.failure_traceback
            if len(tracebacks) == MAX_TRACEBACKS:
                break
    return tracebacks


class FailureReport:
    """Formats each step's failure warning; remembers which reasons' tracebacks have been shown, and when."""

    def __init__(self) -> None:
        self.shown: dict[str, int] = {}
        """Failure reason -> the step whose report showed its traceback."""

    def message(self, step: int, failed: int, total: int, reasons: Counter[str], tracebacks: dict[str, str]) -> str:
        """The warning for one step: every reason's count, and the tracebacks of the reasons not seen before."""
        summary = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common())
        before = sorted({self.shown[r] for r in reasons if r in self.shown})
        new = {r: tb for r, tb in tracebacks.items() if r not in self.shown}
        self.shown.update(dict.fromkeys(new, step))
        text = f"step {step}: {failed} of {total} trajectories failed (left out of the loss): {summary}"
        if before:
            text += f" (reasons seen before: their tracebacks are in the report of step {', '.join(map(str, before))})"
        for reason, traceback in new.items():
            text += f"\nfirst traceback of {reason!r}:\n{traceback}"
        return inert(text)  # reasons and tracebacks may quote a tool's output: shown, not obeyed, on the console
