"""StepProgressBar: steps out of max_steps with the reward and the step time; plain lines when not on a terminal."""

from __future__ import annotations

import re

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lit_agentrl.callbacks import StepProgressBar


class RewardModule(L.LightningModule):
    """Manual optimisation, as GRPOModule; logs a reward of batch_idx / 10 to the progress bar, as RolloutCallback."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.automatic_optimization = False

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(self.layer(batch).sum())
        optimizer.step()
        self.log("rollout/reward", batch_idx / 10, on_step=True, prog_bar=True)

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val/accuracy", 0.5, on_epoch=True, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(torch.ones(8, 1), batch_size=1)  # 8 batches an epoch: the bar must not restart per epoch

    def val_dataloader(self) -> DataLoader:
        return DataLoader(torch.ones(2, 1), batch_size=1)


def fit(bar: StepProgressBar, max_steps: int = 25) -> None:
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        val_check_interval=10,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        callbacks=[bar],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(RewardModule())


def test_step_line_format():
    line = StepProgressBar.step_line(10, 600, {"reward": 0.3125, "step_s": 1.23456, "time/train_s": 0.5})
    assert line == "step 10/600  reward 0.3125  step_s 1.235  time/train_s 0.5"
    assert StepProgressBar.step_line(3, -1, {}) == "step 3/?"


def test_without_a_terminal_it_prints_a_line_every_n_steps(capsys):
    fit(StepProgressBar(line_every_n_steps=10))  # capsys: stdout is not a terminal
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("step ", "validation "))]
    assert [line.split("  ")[0] for line in lines] == [
        "step 10/25",
        "validation at step 10",
        "step 20/25",
        "validation at step 20",
        "step 25/25",
    ]
    assert re.fullmatch(r"step 10/25  reward 0\.1  step_s [0-9.e-]+( .*)?", lines[0]), lines[0]  # batch 1 of epoch 2
    assert lines[1] == "validation at step 10  val/accuracy 0.5"
    assert "\r" not in capsys.readouterr().out


def test_on_a_terminal_it_is_a_bar_of_steps(capsys):
    fit(StepProgressBar(plain=False), max_steps=12)
    out = capsys.readouterr().out
    assert "12/12" in out and "reward=" in out and "step_s=" in out
    assert "Epoch" not in out


def test_line_every_n_steps_must_be_positive():
    with pytest.raises(ValueError, match="line_every_n_steps"):
        StepProgressBar(line_every_n_steps=0)
