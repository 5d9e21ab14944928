"""The trainer's ranks as the rollout side sees them: a :class:`~lit_agentrl.rollout.collective.Collective` over
Lightning's strategy, and this rank's place for its engines."""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.rollout.collective import ReduceOp


class TrainerCollective:
    """The trainer's ranks as the rollout side needs them (:class:`~lit_agentrl.rollout.collective.Collective`)."""

    def __init__(self, trainer: L.Trainer, device: torch.device) -> None:
        self.trainer, self.device = trainer, device

    @property
    def rank(self) -> int:
        return self.trainer.global_rank

    @property
    def world_size(self) -> int:
        return self.trainer.world_size

    def reduce(self, value: float, op: ReduceOp) -> float:
        return float(self.trainer.strategy.reduce(torch.tensor(value, device=self.device), reduce_op=op))

    def all_gather(self, obj: Any) -> list[Any]:
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return [obj]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self, name: str) -> None:
        self.trainer.strategy.barrier(name)


def engine_placement(trainer: L.Trainer) -> EnginePlacement:
    """This rank's place for its engines: Lightning's ranks, and the ranks per node (``LOCAL_WORLD_SIZE`` where the
    launcher sets it, as torchrun does; else the trainer's devices per node).
    """
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE") or trainer.num_devices)
    return EnginePlacement(trainer.global_rank, trainer.local_rank, local_world_size, trainer.world_size)
