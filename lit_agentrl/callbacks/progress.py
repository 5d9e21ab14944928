"""StepProgressBar: a run's progress in optimizer steps out of ``max_steps``, with the reward and the step time.

Lightning's bar counts batches of an epoch, which means nothing to an RL run that ends at ``trainer.max_steps``.
This one shows ``step k/max_steps`` and the metrics logged with ``prog_bar=True`` (``rollout/reward`` first as
``reward``, then ``step_s``, the wall time of the last step: rollout, update and weight sync). When stdout is not a
terminal (a log file, a batch job) tqdm's carriage returns would fill the log, so it prints one plain line every
``line_every_n_steps`` steps instead, and one after each validation.

The CLI adds it unless ``trainer.enable_progress_bar`` is false or ``trainer.callbacks`` already has a progress bar;
configure it there like any callback (``class_path: StepProgressBar``).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import convert_inf

REWARD_KEY = "rollout/reward"  # the progress-bar copy of rollout/reward_mean (RolloutCallback)


class StepProgressBar(TQDMProgressBar):
    """Progress in steps out of ``trainer.max_steps``; plain lines when stdout is not a terminal.

    Args:
        refresh_rate: update the bar every this many steps.
        process_position: as :class:`~lightning.pytorch.callbacks.TQDMProgressBar`.
        leave: as :class:`~lightning.pytorch.callbacks.TQDMProgressBar`.
        line_every_n_steps: with plain lines, print one every this many steps (and at the last step).
        plain: ``True``: plain lines, ``False``: a tqdm bar, ``None``: plain lines when stdout is not a terminal.
    """

    def __init__(
        self,
        refresh_rate: int = 1,
        process_position: int = 0,
        leave: bool = False,
        line_every_n_steps: int = 10,
        plain: bool | None = None,
    ) -> None:
        super().__init__(refresh_rate, process_position, leave)
        if line_every_n_steps < 1:
            raise ValueError(f"StepProgressBar.line_every_n_steps must be >= 1, got {line_every_n_steps}")
        self.line_every_n_steps = line_every_n_steps
        self.plain = plain
        self._step_start: float | None = None
        self._step_seconds: float | None = None
        self._last_line_step = -1

    @property
    def plain_lines(self) -> bool:
        """Whether this bar prints plain lines (decided when it is read: stdout may be redirected late)."""
        return not sys.stdout.isatty() if self.plain is None else self.plain

    @property
    def is_disabled(self) -> bool:
        # Every tqdm bar the parent creates reads this: in plain mode they are all silent.
        return super().is_disabled or self.plain_lines

    # ------------------------------------------------------------------ training

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.train_progress_bar.reset(total=_total_steps(trainer))
        self.train_progress_bar.initial = trainer.global_step  # a resumed run: the rate counts this run's steps
        self.train_progress_bar.n = trainer.global_step
        self.train_progress_bar.set_description("step")
        self._step_start = time.perf_counter()
        self._last_line_step = trainer.global_step

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        """The bar spans the whole run: epochs (passes over the prompts) do not reset it."""

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._step_start is not None:
            self._step_seconds = now - self._step_start
        self._step_start = now
        step = trainer.global_step
        if super().is_disabled:  # not rank 0, or disabled by the trainer
            return
        if self.plain_lines:
            if step // self.line_every_n_steps > self._last_line_step // self.line_every_n_steps or _is_last(trainer):
                self._last_line_step = step
                print(self.step_line(step, trainer.max_steps, self.get_metrics(trainer, pl_module)), flush=True)
        elif self._should_update(step, self.train_progress_bar.total or 0):
            self.train_progress_bar.n = step
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.is_disabled:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float | dict]:
        """The progress-bar metrics, ``reward`` and ``step_s`` first; no ``v_num`` (the logger's version)."""
        logged = dict(super().get_metrics(trainer, pl_module))
        logged.pop("v_num", None)
        metrics: dict[str, int | str | float | dict] = {}
        if REWARD_KEY in logged:
            metrics["reward"] = logged.pop(REWARD_KEY)
        if self._step_seconds is not None:
            metrics["step_s"] = self._step_seconds
        metrics.update(logged)
        return metrics

    # ------------------------------------------------------------------ validation

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        self._step_start = time.perf_counter()  # validation's time is not the next step's
        if self.plain_lines and not super().is_disabled and not trainer.sanity_checking:
            metrics = {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k.startswith("val/")}
            print(f"validation at step {trainer.global_step}{_format(metrics)}", flush=True)

    @staticmethod
    def step_line(step: int, max_steps: int, metrics: dict[str, Any]) -> str:
        """``step 10/600  reward 0.3125  step_s 1.204  time/rollout_s 0.8012  time/train_s 0.3521``."""
        total = str(max_steps) if max_steps > 0 else "?"
        return f"step {step}/{total}{_format(metrics)}"


def _format(metrics: dict[str, Any]) -> str:
    return "".join(
        f"  {key} {value:.4g}" if isinstance(value, float) else f"  {key} {value}" for key, value in metrics.items()
    )


def _total_steps(trainer: L.Trainer) -> int | float | None:
    return trainer.max_steps if trainer.max_steps > 0 else convert_inf(trainer.estimated_stepping_batches)


def _is_last(trainer: L.Trainer) -> bool:
    return 0 < trainer.max_steps <= trainer.global_step
