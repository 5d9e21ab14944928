"""``lit-agentrl fit`` trains an agent written against an OpenAI client, or an environment, exactly as it trains
the same agent written as a LangGraph graph: the multi-turn quickstart's game three ways, same seed, same metrics
step by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT, short_fit

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
    rows = short_fit(deterministic(config, out.parent), model_dir, out)
    return [r for r in rows if r.get("rollout/reward_mean")]


def environment_config(tmp_path) -> str:
    """The multi-turn quickstart with its rows naming the game as an environment (guess_digit_env)."""
    settings = yaml.safe_load((REPO_ROOT / "configs/quickstart_multiturn.yaml").read_text())
    for split in ("train", "val"):
        rows = [json.loads(line) for line in (REPO_ROOT / f"data/quickstart_multiturn/{split}.jsonl").open()]
        path = tmp_path / f"{split}.jsonl"
        path.write_text("".join(json.dumps({**row, "agent_name": "guess_digit_env"}) + "\n" for row in rows))
        settings["data"][f"{split}_files"] = str(path)
    config = tmp_path / "quickstart_multiturn_env.yaml"
    config.write_text(yaml.safe_dump(settings))
    return str(config)


@pytest.mark.parametrize(("variant", "agent"), [("openai", "guess_digit_openai"), ("environment", "guess_digit_env")])
def test_the_game_as_a_client_agent_or_an_environment_trains_like_the_graph(
    tmp_path, quickstart_model_dir, monkeypatch, variant, agent
):
    monkeypatch.chdir(REPO_ROOT)  # the shipped configs name their data and agent YAML from the project root
    graph = fit("configs/quickstart_multiturn.yaml", quickstart_model_dir, tmp_path / "graph")
    config = "configs/quickstart_multiturn_openai.yaml" if variant == "openai" else environment_config(tmp_path)
    other = fit(config, quickstart_model_dir, tmp_path / variant)
    assert len(graph) == len(other) == 3
    for ours, theirs in zip(graph, other):
        assert float(theirs["rollout/failed"]) == 0.0
        for key in COMPARED:
            assert float(theirs[key]) == pytest.approx(float(ours[key]), abs=1e-6), key
        for turn in (1, 2, 3):
            assert theirs[f"agent/{agent}/found_turn_{turn}"] == ours[f"agent/guess_digit/found_turn_{turn}"]
