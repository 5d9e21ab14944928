"""A whole fit through the CLI: the step lines, the end-of-run summary without a CSV logger, the saved config re-runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import quick_config

from lit_agentrl.cli import main

pytestmark = pytest.mark.slow  # whole fits through the CLI


def test_a_fit_without_a_logger_prints_steps_and_the_reward_summary(tmp_path: Path, quickstart_model_dir, capsys):
    config = quick_config(tmp_path, quickstart_model_dir, steps=5)
    main(["fit", "--config", str(config), "--trainer.logger", "false", "--trainer.enable_progress_bar", "true"])
    out = capsys.readouterr().out
    # The default progress bar, without a terminal: a line at the last step (and every 10th).
    assert re.search(r"^step 5/5  reward [0-9.e-]+  step_s [0-9.e-]+", out, re.MULTILINE), out
    assert re.search(r"^rollout/reward_mean: first fifth [0-9.-]+ -> last fifth [0-9.-]+ \([+-][0-9.]+\) over 5 steps$", out, re.MULTILINE), out  # fmt: skip
    assert "metrics:" not in out  # no CSV logger, no metrics file

    saved = tmp_path / "config.yaml"  # SaveConfigCallback's, under trainer.default_root_dir
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(saved), "--print_config"])
    assert exit_info.value.code == 0
    reprinted = capsys.readouterr().out
    assert "lit_agentrl.training.checkpoint.AtomicCheckpointIO" in reprinted and "Unable to serialize" not in reprinted
    assert "StepProgressBar" not in reprinted  # added by the CLI on every run, not part of the config


def test_a_wandb_run_prints_its_folder(tmp_path: Path, quickstart_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-files"))
    logger = {
        "class_path": "lightning.pytorch.loggers.WandbLogger",
        "init_args": {"save_dir": str(tmp_path / "wandb-files"), "offline": True, "project": "lit-agentrl-test"},
    }
    main(["fit", "--config", str(quick_config(tmp_path, quickstart_model_dir, steps=5, logger=logger))])
    out = capsys.readouterr().out
    folder = re.search(r"^wandb: (.*)$", out, re.MULTILINE)
    assert folder and Path(folder.group(1)).is_dir() and list(Path(folder.group(1)).glob("*.wandb")), out
    assert "rollout/reward_mean: first fifth" in out
