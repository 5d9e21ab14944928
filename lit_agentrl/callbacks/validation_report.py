"""The validation's ``pass@k``, ``maj@k`` and ``mean@k`` per ``data_source`` (:mod:`lit_agentrl.rollout.evaluation`),
logged at the end of each validation and written as a table under the log folder, to wandb, and to stdout when only
validating."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from lit_agentrl.rollout.evaluation import EvalResult, PassAtK
from lit_agentrl.types import PromptBatch


class ValidationReport:
    """One validation's per-``data_source`` figures, summed on each rank and reduced over all at the end.

    Args:
        pass_k: the k of ``pass@k`` and ``maj@k`` (``RolloutCallback.validation.pass_k``).
        default_reward: the reward function of rows whose ``data_source`` names none (how their answers are read).
    """

    def __init__(self, pass_k: Sequence[int], default_reward: str | None) -> None:
        self.metric = PassAtK(list(pass_k))
        self.default_reward = default_reward

    def start(self) -> None:
        self.metric.reset()

    def update(self, batch: PromptBatch) -> None:
        if batch.rollout is not None:
            self.metric.update(batch.rows, batch.rollout.trajectories, self.default_reward)

    def finish(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the figures (the same on every rank) and, on rank 0, write the table."""
        result = self.metric.compute()  # collective: every rank's per-data_source sums, added up
        self.metric.reset()
        # Already equal on every rank; "max" keeps them exact where Lightning wants a sync at epoch level.
        pl_module.log_dict(result.metrics("val"), on_epoch=True, sync_dist=True, reduce_fx="max", batch_size=1)
        if trainer.is_global_zero and not trainer.sanity_checking:
            report_table(trainer, result)


def report_table(trainer: Any, result: EvalResult) -> Path:
    """Write the table under ``<log_dir>/eval/``, send it to wandb, and print it when only validating."""
    first = trainer.loggers[0] if trainer.loggers else None
    folder = getattr(first, "log_dir", None) or getattr(first, "save_dir", None) or trainer.default_root_dir
    path = result.write(Path(folder) / "eval", trainer.global_step)
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_table("val/table", columns=result.columns, data=result.rows(), step=trainer.global_step)
    if trainer.state.fn == TrainerFn.VALIDATING:
        print(f"{result.markdown()}\n(table: {path})")
    else:  # fit: one line, the metrics are in the logs
        rank_zero_info(f"validation at step {trainer.global_step}: table {path}")
    return path
