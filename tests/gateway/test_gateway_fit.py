"""``lit-agentrl fit`` trains an agent written against an OpenAI client exactly as it trains the same agent written
as a LangGraph graph: the multi-turn quickstart's game both ways, same seed, same metrics step by step."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT, read_csv

from lit_agentrl.cli import main

pytestmark = pytest.mark.slow

COMPARED = ("rollout/reward_mean", "rollout/response_length_mean", "rollout/num_turns_mean", "train/loss")


def deterministic(config: str, tmp_path) -> str:
    """The shipped config with the engine admitting deterministically: batches, and so the bits of every
    log-prob, then do not depend on when each trajectory's request arrives (HTTP changes that timing)."""
    settings = yaml.safe_load((REPO_ROOT / config).read_text())
    (rollout,) = [c for c in settings["trainer"]["callbacks"] if c["class_path"].endswith("RolloutCallback")]
    rollout["init_args"]["engine"] = {"name": "transformers", "kwargs": {"deterministic": True}}
    path = tmp_path / Path(config).name
    path.write_text(yaml.safe_dump(settings))
    return str(path)


def fit(config: str, model_dir, out) -> list[dict]:
    main(
        [
            "fit",
            "--config",
            deterministic(config, out.parent),
            "--model.model_path",
            str(model_dir),
            "--trainer.max_steps",
            "3",
            "--trainer.val_check_interval",
            "3",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger.init_args.save_dir",
            str(out),
        ]
    )
    rows = read_csv(next(out.rglob("metrics.csv")))
    return [r for r in rows if r.get("rollout/reward_mean")]


def test_the_openai_client_game_trains_like_the_langgraph_one(tmp_path, quickstart_model_dir, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # the shipped configs name their data and agent YAML from the project root
    graph = fit("configs/quickstart_multiturn.yaml", quickstart_model_dir, tmp_path / "graph")
    client = fit("configs/quickstart_multiturn_openai.yaml", quickstart_model_dir, tmp_path / "client")
    assert len(graph) == len(client) == 3
    for ours, theirs in zip(graph, client):
        assert float(theirs["rollout/failed"]) == 0.0
        for key in COMPARED:
            assert float(theirs[key]) == pytest.approx(float(ours[key]), abs=1e-6), key
        for turn in (1, 2, 3):
            assert theirs[f"agent/guess_digit_openai/found_turn_{turn}"] == ours[f"agent/guess_digit/found_turn_{turn}"]
