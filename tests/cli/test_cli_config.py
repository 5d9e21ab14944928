"""The CLI's configuration surface: saved configs re-run as they are, only working subcommands are offered, Lightning
options that GRPOModule's manual optimisation ignores are refused naming the replacement, callbacks by short name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT, quick_config

from lit_agentrl.callbacks import RolloutCallback, StepProgressBar
from lit_agentrl.cli import build_cli, main
from lit_agentrl.training.checkpoint import AtomicCheckpointIO

RUN_CONFIGS = sorted((REPO_ROOT / "configs").glob("*.yaml"))


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str | None, str, str]:
    """``main(args)``'s exit status, stdout and stderr (every command here exits: help, print_config, an error)."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_print_config_round_trips(path: Path, tmp_path: Path, capsys):
    """What --print_config (and the saved config.yaml, the same dump) writes parses again to the same config."""
    code, printed, err = run_main(["fit", "--config", str(path), "--print_config"], capsys)
    assert code == 0, err
    assert "Unable to serialize" not in printed + err
    assert "class_path: lit_agentrl.training.checkpoint.AtomicCheckpointIO" in printed
    saved = tmp_path / "saved.yaml"
    saved.write_text(printed)
    code, reprinted, err = run_main(["fit", "--config", str(saved), "--print_config"], capsys)
    assert code == 0, err
    assert reprinted == printed


@pytest.mark.parametrize("subcommand", ["test", "predict"])
def test_only_working_subcommands_are_offered(subcommand: str, capsys):
    code, _, err = run_main([subcommand, "--config", str(RUN_CONFIGS[0])], capsys)
    assert code == 2
    assert f"invalid choice: '{subcommand}' (choose from 'fit', 'validate')" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args, named, instead",
    [
        (["--trainer.gradient_clip_val", "0.5"], "trainer.gradient_clip_val=0.5", "model.grad_clip"),
        (["--trainer.gradient_clip_algorithm", "value"], "trainer.gradient_clip_algorithm='value'", "model.grad_clip"),
        (["--trainer.accumulate_grad_batches", "4"], "trainer.accumulate_grad_batches=4", "model.mini_batches"),
        (["--trainer.precision", "bf16-mixed"], "trainer.precision='bf16-mixed'", "model.param_dtype"),
        (["--trainer.precision", "16-true"], "trainer.precision='16-true'", "model.param_dtype"),
        (["--optimizer", "Adam", "--optimizer.lr", "0.1"], "optimizer='torch.optim.Adam'", "model.lr"),
        (["--lr_scheduler", "StepLR", "--lr_scheduler.step_size", "3"], "lr_scheduler=", "model.lr_schedule"),
    ],
)
def test_options_manual_optimisation_ignores_are_refused(args, named, instead, capsys, tmp_path):
    code, _, err = run_main(["fit", "--config", str(RUN_CONFIGS[0]), *args], capsys)
    assert code == 2
    first, hint = err.splitlines()[:2]
    assert first.startswith(f"lit-agentrl: error: {named}") and "does not apply" in first
    assert hint.startswith("hint: use ") and instead in hint
    assert "Traceback" not in err


def test_full_precision_is_accepted(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config's folders are relative
    cli = build_cli(["--config", str(RUN_CONFIGS[0]), "--trainer.precision", "32-true"], run=False)
    assert cli.trainer.precision == "32-true"


def test_callbacks_by_short_name_and_the_cli_defaults(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the trainer may create its default_root_dir
    config = yaml.safe_load(quick_config(tmp_path, tmp_path / "model", steps=1).read_text())
    config["trainer"]["callbacks"][0]["class_path"] = "RolloutCallback"
    config["trainer"]["callbacks"].append({"class_path": "HFExportCallback", "init_args": {"dirpath": str(tmp_path)}})
    config["trainer"]["enable_progress_bar"] = None  # Lightning's default: on
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(config))
    trainer = build_cli(["--config", str(path)], run=False).trainer
    names = [type(c).__name__ for c in trainer.callbacks]
    assert {"RolloutCallback", "HFExportCallback", "StepProgressBar"} <= set(names)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_a_configured_progress_bar_replaces_the_default(tmp_path: Path):
    bar = {"class_path": "StepProgressBar", "init_args": {"line_every_n_steps": 50}}
    cli = build_cli(
        ["--config", str(RUN_CONFIGS[0]), "--trainer.callbacks+", yaml.safe_dump(bar), "--trainer.default_root_dir",
         str(tmp_path), "--trainer.logger", "false"],
        run=False,
    )  # fmt: skip
    bars = [c for c in cli.trainer.callbacks if isinstance(c, StepProgressBar)]
    assert [b.line_every_n_steps for b in bars] == [50]
    assert any(isinstance(c, RolloutCallback) for c in cli.trainer.callbacks)


def test_help_points_at_the_callbacks_options(capsys):
    code, out, _ = run_main(["fit", "--help"], capsys)
    assert code == 0 and "--trainer.callbacks.help RolloutCallback" in out
    code, out, _ = run_main(["fit", "--trainer.callbacks.help", "RolloutCallback"], capsys)
    assert code == 0
    assert "--trainer.callbacks.train.n_samples" in out and "--trainer.callbacks.train.sampling_params" in out
    assert "--trainer.callbacks.validation.pass_k" in out and "--trainer.callbacks.health.trajectory_timeout_s" in out
