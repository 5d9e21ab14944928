"""Every YAML shipped in configs/ parses: run configs through the CLI, agent configs as agent cfgs (tests/cli: the
CLI's own behaviour, and --print_config round trips of these configs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT

from lit_agentrl.agents import load_agent_cfg
from lit_agentrl.callbacks import StepProgressBar
from lit_agentrl.cli import build_cli
from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.training.checkpoint import AtomicCheckpointIO
from lit_agentrl.training.module import GRPOModule

RUN_CONFIGS = sorted((REPO_ROOT / "configs").glob("*.yaml"))
AGENT_CONFIGS = sorted((REPO_ROOT / "configs" / "agents").glob("*.yaml"))


def test_there_are_configs():
    assert {p.name for p in RUN_CONFIGS} >= {"quickstart.yaml", "quickstart_multiturn.yaml", "qwen3_8b_math_agent.yaml"}
    assert {p.name for p in AGENT_CONFIGS} >= {"math_eval.yaml", "single_turn.yaml", "guess_digit.yaml"}


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_run_config_parses_and_instantiates(path: Path, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # loggers may create folders
    cli = build_cli(["--config", str(path), "--trainer.accelerator", "cpu", "--trainer.devices", "1"], run=False)
    assert cli.datamodule.tokenizer_path == cli.model.hparams.model_path  # linked by the CLI
    assert isinstance(cli.model, GRPOModule) and isinstance(cli.datamodule, AgentPromptDataModule)
    assert any(type(c).__name__ == "RolloutCallback" for c in cli.trainer.callbacks)
    assert any(isinstance(c, StepProgressBar) for c in cli.trainer.callbacks)  # the CLI's default progress bar
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("#"), "every config opens with a comment giving its launch command"
    assert "lit-agentrl fit --config configs/" + path.name in path.read_text()


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_batch_sizes_divide_among_the_configs_own_processes(path: Path):
    # Checked at setup on the real machines (data.setup): a GPU config that fails there fails after the launch.
    config = yaml.safe_load(path.read_text())
    devices, nodes = config["trainer"].get("devices", 1), config["trainer"].get("num_nodes", 1)
    world = (devices if isinstance(devices, int) else 1) * nodes
    data = config["data"]
    for key in ("prompts_per_step", "val_prompts_per_step"):
        if data.get(key) is not None:
            assert data[key] % world == 0, f"data.{key}={data[key]} is not divisible by {world} processes"


@pytest.mark.parametrize("path", AGENT_CONFIGS, ids=lambda p: p.name)
def test_agent_config_loads(path: Path):
    assert load_agent_cfg(path) is not None


# CPython versions SGLang 0.5.23 publishes wheels for (`pip download --no-deps sglang==0.5.23 --only-binary=:all:
# --python-version 3.X` on PyPI: cp311, cp312 and cp313; no cp310).
SGLANG_PYTHONS = ("3.11", "3.12", "3.13")


def test_the_package_admits_no_python_the_pinned_sglang_cannot_install_on():
    import tomllib

    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "sglang==0.5.23" in project["optional-dependencies"]["sglang"]
    admitted = SpecifierSet(project["requires-python"])
    assert not admitted.contains("3.10")  # a 3.10 user would install the package and then fail on SGLang
    assert all(admitted.contains(v) for v in SGLANG_PYTHONS)
