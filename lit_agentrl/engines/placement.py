"""Where the rollout engines run: which rank starts which engine on which GPUs, as pure arithmetic.

Ranks of one node are numbered by their local rank, and local rank ``r`` trains on GPU ``r``. An engine of
tensor-parallel size ``k`` takes ``k`` consecutive GPUs, so ``k`` consecutive local ranks share it: the
group's first rank starts it on GPUs ``first .. first + k - 1`` (SGLang's ``base_gpu_id = first``, with the
default ``gpu_id_step`` of 1), and pushes the weights into it once per sync; the group's other ranks send
their prompts to it. With ``k = 1`` (the common case) every rank is a group of its own: one engine per rank,
on the rank's own GPU.

A rank alone on its node (local world size 1) is a group of its own whatever ``k`` is: its engine takes
``k`` GPUs from the rank's own, and no other rank of the node can overlap them.

Example, 8 ranks on one node, ``tp_size=2``::

    >>> [EnginePlacement(r, r, 8, 8, tp_size=2).base_gpu_id for r in range(8)]
    [0, 0, 2, 2, 4, 4, 6, 6]
    >>> [r for r in range(8) if EnginePlacement(r, r, 8, 8, tp_size=2).starts_engine]
    [0, 2, 4, 6]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lit_agentrl.errors import UserInputError


@dataclass(frozen=True)
class EnginePlacement:
    """One rank's place in the engine layout; every derived member is a property of these five numbers.

    Args:
        global_rank: the rank among all ranks (Lightning's ``trainer.global_rank``).
        local_rank: the rank among its node's ranks, which is also its GPU (``trainer.local_rank``).
        local_world_size: ranks per node (``LOCAL_WORLD_SIZE``, or ``trainer.num_devices``).
        world_size: ranks in all (``trainer.world_size``); nodes hold ``local_world_size`` ranks each.
        tp_size: the engine's tensor-parallel size (``engine.kwargs.tp_size``).

    Raises ``ValueError`` when the numbers do not describe a layout, naming ``engine.kwargs.tp_size`` when the
    node's ranks cannot be split into groups of ``tp_size``.
    """

    global_rank: int
    local_rank: int
    local_world_size: int
    world_size: int
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise UserInputError(f"engine.kwargs.tp_size must be >= 1, got {self.tp_size}")
        if self.local_world_size < 1 or self.world_size < self.local_world_size:
            raise ValueError(
                f"engine placement: {self.local_world_size} ranks per node and {self.world_size} ranks in all "
                "do not describe a layout (need 1 <= ranks per node <= ranks in all)"
            )
        if not 0 <= self.local_rank < self.local_world_size or not 0 <= self.global_rank < self.world_size:
            raise ValueError(
                f"engine placement: local rank {self.local_rank} of {self.local_world_size} ranks per node, "
                f"global rank {self.global_rank} of {self.world_size}: a rank is out of range (is LOCAL_WORLD_SIZE "
                "right for this launch?)"
            )
        if self.local_world_size > 1 and self.local_world_size % self.tp_size:
            raise UserInputError(
                f"engine.kwargs.tp_size={self.tp_size} does not divide the {self.local_world_size} ranks per node: "
                f"each engine takes tp_size consecutive GPUs of a node, shared by their ranks; use a tp_size that "
                f"divides {self.local_world_size}"
            )

    def with_tp_size(self, tp_size: int) -> EnginePlacement:
        """The same rank's placement for an engine of tensor-parallel size ``tp_size`` (validated again)."""
        return dataclasses.replace(self, tp_size=tp_size)

    @property
    def group_size(self) -> int:
        """How many ranks share one engine: ``tp_size``, or 1 for a rank alone on its node."""
        return self.tp_size if self.local_world_size > 1 else 1

    @property
    def node_rank(self) -> int:
        """Which node the rank is on (nodes hold ``local_world_size`` consecutive global ranks each)."""
        return self.global_rank // self.local_world_size

    @property
    def group(self) -> tuple[int, ...]:
        """The local ranks that share this rank's engine, in order; the first starts it."""
        first = self.local_rank - self.local_rank % self.group_size
        return tuple(range(first, first + self.group_size))

    @property
    def starts_engine(self) -> bool:
        """Whether this rank starts its group's engine (the group's first rank)."""
        return self.local_rank == self.group[0]

    @property
    def base_gpu_id(self) -> int:
        """The first GPU of the group's engine (SGLang's ``base_gpu_id``): the group's first local rank."""
        return self.group[0]

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        """The node's GPUs the group's engine runs on: ``tp_size`` of them from :attr:`base_gpu_id`."""
        return tuple(range(self.base_gpu_id, self.base_gpu_id + self.tp_size))

    @property
    def engines_per_node(self) -> int:
        return self.local_world_size // self.group_size

    @property
    def num_engines(self) -> int:
        """Engines over all nodes."""
        return self.world_size // self.group_size

    @property
    def engine_index(self) -> int:
        """The engine this rank's prompts go to, numbered over all nodes: node by node, group by group."""
        return self.node_rank * self.engines_per_node + self.local_rank // self.group_size

    @property
    def pushes_weights(self) -> bool:
        """Whether this rank pushes the policy's weights into its engine: once per group, by the starter."""
        return self.starts_engine
