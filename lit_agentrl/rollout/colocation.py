"""Colocated mode's memory cycle: the trainer and SGLang take turns on one GPU, and each phase's memory is logged.

Outside a generation window (whenever Lightning, the training step or another callback runs, checkpoints
included) the trainer is resident and SGLang's memory is released. A window opens before a rollout:

1. the optimizer state leaves for host memory (the sync does not need it);
2. SGLang takes its weights back (the trainer's cached memory handed back first), and the new policy is pushed;
3. the parameters leave for host memory, the cache is handed back, and SGLang takes its KV cache back.

and closes after it: SGLang releases its KV cache and weights, and the trainer's states come back. SGLang does not
keep released weights (unless started with ``enable_weights_cpu_backup``), so every window after a release pushes
the policy again. The engine is released once right after it starts, so the trainer loads on a free GPU. With
``offload_trainer`` off, steps 1 and 3 keep the states on the GPU (SGLang then gets less).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lit_agentrl.bridge.offload import TrainerOffload
from lit_agentrl.engines import RolloutEngine

GB = 1e9


def release_cached_memory(device: torch.device) -> None:
    """Return the trainer's cached, unused accelerator memory to the device (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


class PhaseMemory:
    """``memory/*`` metrics of one phase on a CUDA device (none elsewhere): the whole GPU's used memory at its end
    (SGLang's processes included) and the trainer process's peak allocation during it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def finish(self, phase: str) -> dict[str, float]:
        if self.device.type != "cuda":
            return {}
        free, total = torch.cuda.mem_get_info(self.device)
        return {
            f"memory/gpu_used_gb_{phase}": (total - free) / GB,
            f"memory/trainer_peak_gb_{phase}": torch.cuda.max_memory_allocated(self.device) / GB,
        }


class ColocatedCycle:
    """Opens and closes the generation windows of colocated mode (see the module's docstring).

    Args:
        engines: the engines this rank owns (SGLang's, started with ``enable_memory_saver``).
        device: the trainer's device.
        states: the trainer's parts to offload in a window (the policy with its optimizer, the reference); empty
            keeps them on the GPU.
        released: the engines' memory is released now.
        barrier: for engines shared by several ranks: waits for every rank, so that no rank generates before the
            owner has resumed its engine, and the owner releases it only when every rank is done generating.
    """

    def __init__(
        self,
        engines: list[RolloutEngine],
        device: torch.device,
        states: list[TrainerOffload],
        released: bool = False,
        barrier: Callable[[], None] | None = None,
    ) -> None:
        self.engines, self.device, self.states = engines, device, states
        self.barrier = barrier or (lambda: None)
        self.released = released  # SGLang's memory is released: its weights must be pushed again
        self.open = False

    def enter(self, sync: Callable[[], None]) -> None:
        """Open a window: SGLang resident with the current weights (``sync`` pushes them, if the engine was released
        or the policy changed), the trainer offloaded."""
        for state in self.states:
            state.offload_optimizer()
        if self.released:
            release_cached_memory(self.device)
            for engine in self.engines:
                engine.resume_memory_occupation(tags=["weights"])
        sync()
        for state in self.states:
            state.offload_parameters()
        if self.released or self.states:
            release_cached_memory(self.device)
        if self.released:
            for engine in self.engines:
                engine.resume_memory_occupation(tags=["kv_cache"])
        self.barrier()
        self.released, self.open = False, True

    def leave(self) -> None:
        """Close the window: SGLang's memory released (it must be idle), the trainer's states back on the GPU."""
        if not self.open:
            return
        self.barrier()
        for engine in self.engines:
            engine.release_memory_occupation(tags=["kv_cache", "weights"])
        for state in self.states:
            state.restore()
        self.released, self.open = True, False

    @property
    def offloaded_gb(self) -> float:
        return sum(state.offloaded_bytes for state in self.states) / GB
