"""Rollouts whose batches do not depend on timing: the admission gate between a rollout's trajectories and its engines.

Logits computed in different batch compositions differ in their last bits (CPU GEMMs and attention kernels block
by shape), so the engine's log-probs, and now and then a sampled token, depend on which requests happened to be
batched together, which on a loaded machine depends on timing. A resumed run would then not train the weights an
unbroken one trains. The gate removes timing from the composition:

* every trajectory of a rollout is known to the gate before any starts, in a fixed order, in its lane (one per
  engine, or one for all): at most ``capacity`` of a lane run at once, the others queue in that order and get the
  slot of the next one of their lane to finish;
* every request carries its trajectory's key (its ``TrajectoryTag``, in the trajectory's context set per trajectory
  task by the rollout manager: :mod:`lit_agentrl.context`) and is the key's k-th request, which seeds its sampling
  stream;
* a deterministic engine admits new requests only when the gate is *quiescent*: every running trajectory is
  waiting on the engine (or has finished). It then admits them in key order.

So the engine's steps, and which requests share them, follow from the requests alone. The price: after a step in
which requests finished, the engine waits until their agents have run and asked again (or finished), where a
timing-driven engine would go on decoding the others (see docs/checkpoints.md).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, deque
from collections.abc import Hashable, Sequence

from lit_agentrl.context import TrajectoryTag


class AdmissionGate:
    """One rollout's trajectories: which run (hold a slot), which wait for one, and which wait on the engine.

    State changes come from the event loop's thread (slots, submissions) and from engine threads (answers); the
    engine waits on the condition. A trajectory that submits several requests at once (``n > 1``, a batch) is
    waiting from its first; one that overlaps model calls in separate tasks must submit them before awaiting any,
    or the engine may start a step between them (it stays correct, but is no longer independent of timing).
    """

    def __init__(self, lanes: Sequence[Sequence[tuple[int, int]]], capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._condition = threading.Condition()
        self._running: set[tuple[int, int]] = set()
        self._queued: list[deque[tuple[int, int]]] = []
        self._lane: dict[tuple[int, int], int] = {}
        for index, keys in enumerate(lanes):  # a lane per engine (or one for all): its first keys run at once
            self._running.update(keys[:capacity])
            self._queued.append(deque(keys[capacity:]))
            self._lane.update((key, index) for key in keys)
        self._slots: dict[tuple[int, int], asyncio.Future[None]] = {}
        self._outstanding: Counter[tuple[int, int]] = Counter()
        self._requests: Counter[tuple[int, int]] = Counter()
        self._versions: dict[tuple[int, int], tuple[int, int]] = {}

    # ------------------------------------------------------------------ trajectories (event loop thread)

    async def acquire(self, key: tuple[int, int]) -> None:
        """Wait for the trajectory's slot: at once for the first ``capacity`` keys of its lane, else when one is
        handed on."""
        with self._condition:
            if key in self._running:
                return
            slot = self._slots.setdefault(key, asyncio.get_running_loop().create_future())
        await slot

    def release(self, key: tuple[int, int]) -> None:
        """The trajectory is done with the engine: its slot goes to the first queued key of its lane, running from
        now on (so the engine waits for its first request rather than starting a step without it)."""
        with self._condition:
            self._running.discard(key)
            queued = self._queued[self._lane[key]]
            if queued:
                successor = queued.popleft()
                self._running.add(successor)
                slot = self._slots.setdefault(successor, asyncio.get_running_loop().create_future())
                slot.set_result(None)
            self._condition.notify_all()

    # ------------------------------------------------------------------ requests (caller, then engine thread)

    def next_request_index(self, key: tuple[int, int]) -> int:
        """The index of the trajectory's next request among its requests (it seeds the request's sampling)."""
        with self._condition:
            index = self._requests[key]
            self._requests[key] += 1
            return index

    def submitted(self, key: tuple[int, int]) -> None:
        """Count a request of ``key`` as waiting on the engine (called once it is in the engine's queue)."""
        with self._condition:
            self._outstanding[key] += 1
            self._condition.notify_all()

    def answered(self, key: tuple[int, int]) -> None:
        """Called before the answer is handed over: from then on its trajectory runs again."""
        with self._condition:
            self._outstanding[key] -= 1

    def note_version(self, key: tuple[int, int], version: int) -> None:
        """Record that some of the trajectory's tokens came from weights of ``version``."""
        with self._condition:
            low, high = self._versions.get(key, (version, version))
            self._versions[key] = (min(low, version), max(high, version))

    def versions(self, key: tuple[int, int]) -> tuple[int, int] | None:
        """The oldest and newest weight versions recorded for the trajectory."""
        with self._condition:
            return self._versions.get(key)

    def quiescent(self) -> bool:
        with self._condition:
            return self._quiescent()

    def wait_quiescent(self, timeout: float) -> bool:
        """Block until every running trajectory waits on the engine; False if ``timeout`` seconds pass first."""
        with self._condition:
            return self._condition.wait_for(self._quiescent, timeout)

    @property
    def finished(self) -> bool:
        """Every trajectory has finished: nothing more will come through this gate."""
        with self._condition:
            return not self._running and not any(self._queued)

    def _quiescent(self) -> bool:
        return all(self._outstanding[key] > 0 for key in self._running)


def request_order(tag: TrajectoryTag | None, index: int) -> tuple[Hashable, ...]:
    """Sort key of a request within one admission: gated requests by (key, index), others after them in arrival
    order."""
    return (0, *tag.key, index) if tag is not None else (1, index)
