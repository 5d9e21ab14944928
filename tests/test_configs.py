"""Every YAML shipped in configs/ parses: run configs through LightningCLI, agent configs as agent cfgs."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import REPO_ROOT

from lit_agentrl.agents import load_agent_cfg
from lit_agentrl.cli import AgentRLCLI
from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.module import GRPOModule

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
    cli = AgentRLCLI(
        GRPOModule,
        AgentPromptDataModule,
        run=False,
        args=["--config", str(path), "--trainer.accelerator", "cpu", "--trainer.devices", "1"],
        trainer_defaults={"use_distributed_sampler": False},
    )
    assert cli.datamodule.tokenizer_path == cli.model.hparams.model_path  # linked by the CLI
    assert isinstance(cli.model, GRPOModule) and isinstance(cli.datamodule, AgentPromptDataModule)
    assert any(type(c).__name__ == "RolloutCallback" for c in cli.trainer.callbacks)
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("#"), "every config opens with a comment giving its launch command"
    assert "lit-agentrl fit --config configs/" + path.name in path.read_text()


@pytest.mark.parametrize("path", AGENT_CONFIGS, ids=lambda p: p.name)
def test_agent_config_loads(path: Path):
    assert load_agent_cfg(path) is not None
