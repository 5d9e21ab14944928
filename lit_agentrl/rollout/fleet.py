"""One rank's rollout engines as a whole: built where the placement says, kept at the policy's weights (with a
version), released and resumed around the trainer in colocated mode, and shut down.

Nothing here knows Lightning: ``RolloutCallback`` builds a fleet at setup and calls :meth:`EngineFleet.prepare`
before each rollout; tests drive it with fake engines and a plain ``torch.nn.Module``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from lit_agentrl.bridge.offload import TrainerOffload
from lit_agentrl.bridge.weights import sync_weights
from lit_agentrl.config.training import Lora
from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.dtypes import torch_dtype
from lit_agentrl.rollout.collective import Collective, SingleProcess
from lit_agentrl.rollout.colocation import ColocatedCycle

OffloadStates = Callable[[], list[TrainerOffload]]
"""The trainer's parts to move to host memory in a colocated window (built on the first window: the model and the
optimizer exist only once the trainer has set up)."""


def check_serves_adapters(engine_classes: list[type[RolloutEngine]]) -> None:
    """Refuse ``model.lora.sync: adapter`` with engines that cannot serve a LoRA adapter."""
    refusing = sorted({cls.__name__ for cls in engine_classes if not cls.serves_lora_adapters})
    if refusing:
        raise UserInputError(
            f"model.lora.sync: adapter needs engines that serve LoRA adapters; {refusing} do not: set "
            "model.lora.sync: merged (every engine takes merged weights) or engine: transformers"
        )


def check_lora_serving(engines: list[RolloutEngine], lora: Lora) -> None:
    """Refuse ``model.lora.sync: adapter`` when a running engine cannot serve ``lora``'s adapters (an SGLang server
    started without LoRA, or for a smaller rank or other modules), naming what it lacks."""
    problems = [problem for engine in engines if (problem := engine.lora_serving_problem(lora))]
    base_dtype = torch_dtype(lora.base_dtype, "model.lora.base_dtype")
    for engine in engines:  # the engine keeps its own base: in another dtype it samples from another policy
        if engine.weight_dtype not in (None, base_dtype):
            problems.append(
                f"{type(engine).__name__} holds the base in {engine.weight_dtype} and the trainer in {base_dtype}, so "
                "the engine would sample from another policy than the one trained: give engine.kwargs.dtype and "
                "model.lora.base_dtype one value"
            )
    if problems:
        raise UserInputError(
            "model.lora.sync: adapter: " + "; ".join(problems),
            hint="start the engines to serve the adapters, or set model.lora.sync: merged (the merged weights pushed)",
        )


class EngineFleet:
    """The engines of one rank.

    Args:
        engines: as :func:`~lit_agentrl.engines.build_engines` built them.
        bucket_bytes: the size of one weight-push bucket.
        collective: the ranks (a shared engine is pushed by its owner, and no rank generates before it has).
        colocate: the engines share the trainer's GPU; they are released at once, and each rollout opens a window
            (:class:`~lit_agentrl.rollout.colocation.ColocatedCycle`).
        offload_states: in colocated mode, the trainer's parts to offload in a window (None: they stay).
        lora: the policy's LoRA settings (None: full weights): pushes merge the adapters in, or with
            ``sync: adapter`` send them alone, which every engine must serve (checked here).
    """

    def __init__(
        self,
        engines: list[RolloutEngine],
        bucket_bytes: int = 512 << 20,
        collective: Collective | None = None,
        colocate: bool = False,
        offload_states: OffloadStates | None = None,
        lora: Lora | None = None,
    ) -> None:
        if lora is not None and lora.syncs_adapter:
            check_serves_adapters([type(e) for e in engines if e.owner])
            check_lora_serving([e for e in engines if e.owner], lora)
        self.engines = engines
        self.lora = lora
        self.bucket_bytes = bucket_bytes
        self.collective = collective or SingleProcess()
        self.colocate = colocate
        self.offload_states = offload_states
        self.cycle: ColocatedCycle | None = None
        self.stale = False
        """The policy has changed since the last push (or the engines never had its weights)."""
        self.pushes = 0
        self.pushed_bytes = 0
        """The bytes the last push sent to each owned engine (in its dtype; 0 on a rank that owns none)."""
        if colocate:  # the trainer loads on a free GPU; the first window resumes the engines and pushes the weights
            for engine in self.owned:
                engine.release_memory_occupation(tags=["kv_cache", "weights"])

    @property
    def shared(self) -> bool:
        """Whether an engine serves several ranks (one pushes, all generate)."""
        return any(engine.shared for engine in self.engines)

    @property
    def owned(self) -> list[RolloutEngine]:
        """The engines this rank pushes weights into, releases and resumes (all but other ranks' servers)."""
        return [engine for engine in self.engines if engine.owner]

    def busy_seconds(self) -> float | None:
        """Model compute of the engines that count it, so far (None when none does, as SGLang's)."""
        counts = [engine.busy_seconds for engine in self.engines if engine.busy_seconds is not None]
        return sum(counts) if counts else None

    def prepare(
        self,
        device: torch.device,
        policy: torch.nn.Module,
        version: int,
        before_push: Callable[[], None] = lambda: None,
    ) -> float | None:
        """Bring the engines up to date before they generate: the weights pushed if stale (``before_push`` first), and
        in colocated mode a generation window opened (a no-op while one is open). Returns the push's seconds, if any.
        Every rank calls it together (the push gathers the sharded policy)."""
        pushed: list[float] = []

        def push_if_stale() -> None:
            if self.stale:
                before_push()
                pushed.append(self.push(policy, version))

        cycle = self._cycle(device)
        if cycle is not None and not cycle.open:
            self.stale |= cycle.released  # SGLang dropped its weights with its memory
            cycle.enter(push_if_stale)
        else:
            push_if_stale()
        return pushed[0] if pushed else None

    def push(self, policy: torch.nn.Module, version: int) -> float:
        """Copy ``policy``'s weights into the owned engines as weight version ``version``; returns the seconds."""
        start = time.perf_counter()
        pushed = sync_weights(policy, self.owned, self.bucket_bytes, version, self.lora)  # every rank gathers
        self.pushed_bytes = pushed.bytes if self.owned else 0  # a rank whose engines another rank owns sends none
        if self.shared:  # no rank may generate from a shared engine before its owner has updated it
            self.collective.barrier("rollout_weight_sync")
        for engine in self.engines:
            if not engine.owner:  # its owner pushed: this rank's trajectories record the version (staleness) and,
                engine.weight_version = version  # with sync: adapter, its requests name the adapter the owner loaded
                if self.lora is not None and self.lora.syncs_adapter:
                    engine.follow_lora_adapter()
        self.pushes += 1
        self.stale = False
        return time.perf_counter() - start

    def close_window(self) -> float | None:
        """Colocated mode: give the trainer its memory back (the engines must be idle); returns the GB offloaded in the
        window that closes, None outside colocated mode."""
        if self.cycle is None:
            return None
        offloaded = self.cycle.offloaded_gb
        self.cycle.leave()
        return offloaded

    def shutdown(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        self.engines = []

    def _cycle(self, device: torch.device) -> ColocatedCycle | None:
        """Colocated mode's cycle, built on first use."""
        if not self.colocate:
            return None
        if self.cycle is None:
            states = self.offload_states() if self.offload_states is not None else []
            barrier = (lambda: self.collective.barrier("colocated_engine_memory")) if self.shared else None
            self.cycle = ColocatedCycle(self.owned, device, states, released=True, barrier=barrier)
        return self.cycle
