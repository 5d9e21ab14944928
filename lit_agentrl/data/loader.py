"""PromptBatchLoader: each rank's share of each step's prompts, a seeded shuffle per epoch, resumable mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from lit_agentrl.errors import UserInputError
from lit_agentrl.types import PromptBatch

EXTRA_STREAM = 1_000_003
"""Offset of the extra stream's shuffle seeds (dynamic sampling) from the steps' own."""


class PromptBatchLoader:
    """Yields this rank's share of each step's prompts: a seeded shuffle per epoch, resumable mid-epoch.

    Every rank draws the same permutation and takes its slice of each global batch, so ranks never
    overlap. Lightning saves ``state_dict()`` in checkpoints (the loader is ``_Stateful``); the position
    advances only when a batch is consumed (:meth:`mark_consumed`), not when it is prefetched. Training drops
    an epoch's last partial batch (every step has the same size); with ``whole_epoch`` (validation) the last
    batch holds the remaining rows, split across the ranks as evenly as they go, so every row is seen.
    """

    def __init__(
        self,
        rows: list[dict[str, Any]],
        prompts_per_step: int,
        seed: int,
        shuffle: bool,
        rank: int,
        world_size: int,
        split: str,
        whole_epoch: bool = False,
    ) -> None:
        self.rows, self.prompts_per_step, self.seed, self.shuffle = rows, prompts_per_step, seed, shuffle
        self.rank, self.world_size, self.split, self.whole_epoch = rank, world_size, split, whole_epoch
        self.epoch, self.consumed = 0, 0
        self.extra_drawn = 0  # rows drawn so far from the extra stream (dynamic sampling), over all ranks

    def __len__(self) -> int:
        whole, remainder = divmod(len(self.rows), self.prompts_per_step)
        return whole + int(self.whole_epoch and remainder > 0)

    def __iter__(self) -> Iterator[PromptBatch]:
        if self.consumed >= len(self):
            self.epoch, self.consumed = self.epoch + 1, 0
        order = self._order(self.epoch)
        for index in range(self.consumed, len(self)):
            start, end = self._rank_slice(index)
            rows = [self.rows[i] for i in order[start:end]]
            yield PromptBatch(rows=rows, epoch=self.epoch, index=index, split=self.split)

    def _rank_slice(self, index: int) -> tuple[int, int]:
        """This rank's positions in the epoch's order for batch ``index`` (the last one may be partial)."""
        first = index * self.prompts_per_step
        size = min(self.prompts_per_step, len(self.rows) - first)
        per_rank, extra = divmod(size, self.world_size)
        start = first + self.rank * per_rank + min(self.rank, extra)
        return start, start + per_rank + int(self.rank < extra)

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.rows)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.rows), generator=generator).tolist()

    def batch_after(self, batch: PromptBatch, ahead: int) -> PromptBatch:
        """The batch iteration yields ``ahead`` batches after ``batch`` (into later epochs as needed), without
        moving the position: rollouts generated ahead of their step (``mode: async``) are for the batches Lightning
        will fetch, and a resumed run regenerates those it lost."""
        position = batch.index + ahead
        return self.batch_at(batch.epoch + position // len(self), position % len(self))

    def batch_at(self, epoch: int, index: int) -> PromptBatch:
        """This rank's batch ``index`` of ``epoch``, without moving the position."""
        start, end = self._rank_slice(index)
        rows = [self.rows[i] for i in self._order(epoch)[start:end]]
        return PromptBatch(rows=rows, epoch=epoch, index=index, split=self.split)

    def mark_consumed(self, batch: PromptBatch) -> None:
        self.epoch, self.consumed = batch.epoch, batch.index + 1

    def draw_extra(self) -> list[dict[str, Any]]:
        """This rank's share of one more step's worth of prompts, for dynamic sampling.

        They come from a stream of their own (seeded shuffles of the rows, one after another), not from the steps'
        stream, which Lightning has already prefetched from; its position is part of :meth:`state_dict`, so a
        resumed run draws the same extra prompts as an unbroken one.
        """
        per_rank = self.prompts_per_step // self.world_size
        first = self.extra_drawn + self.rank * per_rank
        positions = range(first, first + per_rank)
        self.extra_drawn += self.prompts_per_step
        n = len(self.rows)
        return [self.rows[self._order(EXTRA_STREAM + p // n)[p % n]] for p in positions]

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "extra_drawn": self.extra_drawn,
            "seed": self.seed,
            "num_rows": len(self.rows),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("num_rows", len(self.rows)) != len(self.rows) or state.get("seed", self.seed) != self.seed:
            raise UserInputError(
                f"cannot resume the data position: the checkpoint was taken with {state.get('num_rows')} rows and seed "
                f"{state.get('seed')}, this run has {len(self.rows)} rows and seed {self.seed}"
            )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        self.extra_drawn = int(state.get("extra_drawn", 0))
