"""The running trajectory: set once by the rollout manager in each trajectory's own task, read through
:func:`current_trajectory` by whatever that trajectory calls (the chat model, the engines, the tools).

It carries what the trajectory's requests must bear (its admission gate, key and rollout seed: ``TrajectoryTag``),
the rollout's sampling parameters (a chat model called without its own uses them) and the faults reported in it
(:func:`report_fault`), so nothing of the rollout reaches an agent's code as an argument it would have to pass on.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol


class Admission(Protocol):
    """What a trajectory's requests and the engines tell their rollout's admission gate and ask of it
    (:class:`lit_agentrl.engines.admission.AdmissionGate`, made by the rollout manager)."""

    async def acquire(self, key: tuple[int, int]) -> None: ...
    def release(self, key: tuple[int, int]) -> None: ...
    def next_request_index(self, key: tuple[int, int]) -> int: ...
    def submitted(self, key: tuple[int, int]) -> None: ...
    def answered(self, key: tuple[int, int]) -> None: ...
    def note_version(self, key: tuple[int, int], version: int) -> None: ...
    def versions(self, key: tuple[int, int]) -> tuple[int, int] | None: ...
    def wait_quiescent(self, timeout: float) -> bool: ...

    @property
    def finished(self) -> bool: ...


@dataclass(frozen=True)
class TrajectoryTag:
    """What a trajectory's requests carry: its rollout's gate and its key there."""

    gate: Admission
    key: tuple[int, int]
    """(group, sample): the row's index in the rollout and the sample's among the row's."""
    seed: int | None = None
    """The rollout's seed: with the key and the request's index it seeds the request's sampling stream (None: the
    engine's own seed), so rollouts that overlap (``async_rollouts``) never share or disturb each other's streams."""


@dataclass
class TrajectoryContext:
    """One trajectory's context (see the module's docstring)."""

    tag: TrajectoryTag | None = None
    sampling_params: Mapping[str, Any] | None = None
    """The rollout's sampling parameters (``config.sampling.SamplingParams``, which reads as SGLang's dict)."""
    faults: list[str] = field(default_factory=list)
    """Faults reported in the trajectory: each fails it once its agent returns, whatever the agent caught."""
    route_key: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Unique to the trajectory: a router sends every call bearing it to the same server (whose prefix cache holds
    the trajectory's earlier turns)."""


_CURRENT: ContextVar[TrajectoryContext | None] = ContextVar("lit_agentrl_trajectory", default=None)


def enter_trajectory(context: TrajectoryContext) -> TrajectoryContext:
    """Make ``context`` the current task's trajectory (and its child tasks'); returns it."""
    _CURRENT.set(context)
    return context


def current_trajectory() -> TrajectoryContext | None:
    """The running trajectory's context (None outside a rollout manager's trajectory)."""
    return _CURRENT.get()


def current_tag() -> TrajectoryTag | None:
    """What the running trajectory's requests carry (None outside a rollout)."""
    context = _CURRENT.get()
    return context.tag if context is not None else None


def report_fault(reason: str) -> None:
    """Fail the running trajectory with ``reason`` once its agent returns (no-op outside a rollout).

    Agents often wrap tool calls in a bare ``except:`` and tell the model "tool execute error" (the seed's examples
    do), which is right for the model's mistakes and wrong for a broken set-up: code that detects such a fault calls
    this before it raises, so the run does not train on trajectories whose every tool call failed and exit 0.
    """
    context = _CURRENT.get()
    if context is not None:
        context.faults.append(reason)
