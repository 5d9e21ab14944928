"""TrajectoryLog: a bounded sample of each step's trajectories as JSON lines under the run's folder, and the same
samples to the configured logger (a ``wandb.Table`` under wandb, text files under CSV)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from lit_agentrl.models.processors import load_tokenizer
from lit_agentrl.types import Trajectory
from lit_agentrl.viewer.records import TABLE_COLUMNS, TokenPieces, table_row, trajectory_record
from lit_agentrl.viewer.writer import BackgroundWriter, append_jsonl, write_samples_text


class TrajectoryLog(Callback):
    """Write a sample of every N-th step's trajectories to ``<run folder>/trajectories/rank{R}.jsonl``.

    Args:
        every_n_steps: log the training trajectories of every N-th step (the step the loggers use).
        max_per_step: trajectories per step and rank, chosen as whole prompt groups (a GRPO group's samples stay
            together: their advantages only make sense side by side); None logs every trajectory.
        max_failed_per_step: failed trajectories added beyond ``max_per_step`` when the chosen groups miss them.
        log_validation: log validation trajectories too (``split: val``; at most ``max_per_step`` per validation
            run and rank, plus the failed ones).
        log_tokens: add the token-level fields the viewer colours (``token_ids``, ``tokens``, ``loss_mask``,
            ``logprobs``); they are most of a line's size.
        to_logger: send rank 0's training samples to the logger too: a ``wandb.Table`` under the key
            ``rollout/samples`` (WandbLogger), ``samples/step_NNNNNN.txt`` in the log folder (CSVLogger).
        dirpath: the folder to write ``trajectories/`` into (default: the run's folder, see below).

    The run's folder is the first logger's ``log_dir`` (CSV, TensorBoard), a wandb run's own folder
    (``wandb/run-.../``), else ``trainer.default_root_dir``. Each rank appends to its own file, so ranks never
    interleave and a resumed run writing into the same folder appends. Lines are written by a background thread, a
    step at a time: a step's lines are on disk before the next step's are submitted. ``lit-agentrl view`` renders
    the log as a page.
    """

    def __init__(
        self,
        every_n_steps: int = 1,
        max_per_step: int | None = 16,
        max_failed_per_step: int = 4,
        log_validation: bool = True,
        log_tokens: bool = True,
        to_logger: bool = True,
        dirpath: str | None = None,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"TrajectoryLog.every_n_steps must be >= 1, got {every_n_steps}")
        if (max_per_step is not None and max_per_step < 0) or max_failed_per_step < 0:
            raise ValueError(
                f"TrajectoryLog.max_per_step and max_failed_per_step must be >= 0, got {max_per_step} and "
                f"{max_failed_per_step}"
            )
        self.every_n_steps = every_n_steps
        self.max_per_step = max_per_step
        self.max_failed_per_step = max_failed_per_step
        self.log_validation = log_validation
        self.log_tokens = log_tokens
        self.to_logger = to_logger
        self.dirpath = dirpath
        self.path: Path | None = None
        self._pieces: TokenPieces | None = None
        self._writer: BackgroundWriter | None = None
        self._val_room = max_per_step

    # ------------------------------------------------------------------ lifecycle

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        folder = Path(self.dirpath) if self.dirpath else run_folder(trainer)
        self.path = folder / "trajectories" / f"rank{trainer.global_rank}.jsonl"
        model_path = getattr(pl_module, "model_path", None)
        if self.log_tokens and self._pieces is None and model_path:
            self._pieces = TokenPieces(load_tokenizer(model_path))
        if self._writer is None:
            self._writer = BackgroundWriter()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._writer is not None:  # what the run logged before it broke is what one reads to see why
            self._writer.wait()

    # ------------------------------------------------------------------ training

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = logged_step(trainer)
        rollout = getattr(batch, "rollout", None)
        if rollout is None or step % self.every_n_steps:
            return
        chosen = select_trajectories(rollout.trajectories, self.max_per_step, self.max_failed_per_step)
        records = self._write(trainer, batch, chosen, step, "train", batch_idx)
        if self.to_logger and records and trainer.is_global_zero:
            self._to_logger(trainer, records, step)

    # ------------------------------------------------------------------ validation

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_room = self.max_per_step

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        rollout = getattr(batch, "rollout", None)
        if rollout is None or trainer.sanity_checking or not self.log_validation:
            return
        chosen = select_trajectories(rollout.trajectories, self._val_room, self.max_failed_per_step)
        if self._val_room is not None:
            self._val_room = max(0, self._val_room - len(chosen))
        self._write(trainer, batch, chosen, logged_step(trainer), "val", batch_idx)

    # ------------------------------------------------------------------ writing

    def _write(
        self, trainer: L.Trainer, batch: Any, chosen: list[Trajectory], step: int, split: str, batch_idx: int
    ) -> list[dict[str, Any]]:
        if not chosen:
            return []
        if self._writer is None or self.path is None:
            raise RuntimeError("TrajectoryLog.setup has not run: the callback must be in trainer.callbacks")
        rows = list(getattr(batch, "rows", []))
        records = [
            trajectory_record(
                t,
                rows[t.group] if t.group < len(rows) else None,
                step=step,
                split=split,
                rank=trainer.global_rank,
                batch=batch_idx,
                tokens=self.log_tokens,
            )
            for t in chosen
        ]
        self._writer.submit(append_jsonl, self.path, records, self._pieces)
        return records

    def _to_logger(self, trainer: L.Trainer, records: list[dict[str, Any]], step: int) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                rows = [table_row(r) for r in records]
                logger.log_table("rollout/samples", columns=TABLE_COLUMNS, data=rows, step=step)
            elif isinstance(logger, CSVLogger) and self._writer is not None:
                path = Path(logger.log_dir) / "samples" / f"step_{step:06d}.txt"
                self._writer.submit(write_samples_text, path, records)


def select_trajectories(
    trajectories: Sequence[Trajectory], max_per_step: int | None, max_failed: int
) -> list[Trajectory]:
    """A step's bounded, deterministic sample, in the rollout's order: whole groups, in group order, while they fit in
    ``max_per_step`` (a first group larger than that is cut), then up to ``max_failed`` failed trajectories not
    already chosen. None: every trajectory."""
    if max_per_step is None:
        return list(trajectories)
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group, []).append(t)
    chosen: list[Trajectory] = []
    for members in groups.values():
        room = max_per_step - len(chosen)
        if room > 0 and (not chosen or len(members) <= room):
            chosen.extend(members[:room])
    picked = {id(t) for t in chosen}
    picked |= {id(t) for t in [t for t in trajectories if t.failed and id(t) not in picked][:max_failed]}
    return [t for t in trajectories if id(t) in picked]


def logged_step(trainer: L.Trainer) -> int:
    """The step the loggers give the current batch's metrics (``step`` in metrics.csv): the batches that stepped
    before it. Not ``global_step``, which counts optimizer steps (``model.mini_batches`` of them per batch)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def run_folder(trainer: L.Trainer) -> Path:
    """Rank 0's run folder, the same on every rank (loggers create their folders on rank 0 only)."""
    folder = str(_local_run_folder(trainer)) if trainer.is_global_zero else None
    shared = trainer.strategy.broadcast(folder)
    if shared is None:
        raise RuntimeError("TrajectoryLog: rank 0 broadcast no run folder")
    return Path(shared)


def _local_run_folder(trainer: L.Trainer) -> Path:
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    if isinstance(logger, WandbLogger):  # save_dir is shared by every run; the run's folder is files/'s parent
        return Path(logger.experiment.dir).parent
    return Path(getattr(logger, "log_dir", None) or logger.save_dir or trainer.default_root_dir)
