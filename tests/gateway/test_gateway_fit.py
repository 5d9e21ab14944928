"""``lit-agentrl fit`` trains an agent written against an OpenAI client, or an environment, exactly as it trains
the same agent written as a LangGraph graph: the multi-turn quickstart's game three ways, same seed, same metrics
step by step. And every kind of client (LangChain, LangGraph's ReAct, the Agents SDK, smolagents, a program, several
sequences per trajectory) trains through the CLI from one data file."""

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


CLIENT_KINDS = (
    "guess_digit_openai",
    "kinds_chatopenai",
    "kinds_react",
    "kinds_agents_sdk",
    "kinds_smolagents",
    "kinds_several_sequences",
    "openai_command",
    "guess_digit_env",
)


def client_kinds_config(tmp_path) -> str:
    """The OpenAI-client quickstart with its rows spread over every kind of client (tests/gateway/client_kinds.py),
    a program and an environment, and sequences scored on their own."""
    from client_kinds import PROGRAM

    program = tmp_path / "program.yaml"
    program.write_text(yaml.safe_dump({"command": PROGRAM}))
    settings = yaml.safe_load((REPO_ROOT / "configs/quickstart_multiturn_openai.yaml").read_text())
    rows = [json.loads(line) for line in (REPO_ROOT / "data/quickstart_multiturn_openai/train.jsonl").open()][:16]
    for index, row in enumerate(rows):
        row["agent_name"] = CLIENT_KINDS[index % len(CLIENT_KINDS)]
        if row["agent_name"] == "openai_command":
            row["agent_cfg_path"] = str(program)
    data = tmp_path / "kinds.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings["data"].update(
        train_files=str(data),
        val_files=str(data),
        prompts_per_step=16,
        val_prompts_per_step=16,
        shuffle=False,
        agent_modules=[str(Path(__file__).with_name("client_kinds.py"))],
    )
    settings["model"]["loss"] = {"sequence_rewards": "own"}
    (rollout,) = [c for c in settings["trainer"]["callbacks"] if c["class_path"].endswith("RolloutCallback")]
    rollout["init_args"]["train"]["n_samples"] = 2
    path = tmp_path / "kinds.yaml"
    path.write_text(yaml.safe_dump(settings))
    return str(path)


def test_every_kind_of_client_trains_through_the_cli_in_one_data_file(tmp_path, quickstart_model_dir, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    rows = short_fit(client_kinds_config(tmp_path), quickstart_model_dir, tmp_path / "kinds", steps=2)
    steps = [r for r in rows if r.get("rollout/reward_mean")]
    assert len(steps) == 2
    for row in steps:
        assert float(row["rollout/failed"]) == 0.0, row
        assert float(row["rollout/trajectories"]) == 32.0  # trajectories, not sequences
        assert abs(float(row["train/loss"])) < 1e3
    assert [r for r in rows if r.get("val/reward_mean")]
    log = [json.loads(line) for path in (tmp_path / "kinds").rglob("trajectories/*.jsonl") for line in path.open()]
    train = [record for record in log if record["split"] == "train"]
    assert {record["agent_name"] for record in train} == set(CLIENT_KINDS)
    for record in train:
        assert not record["failed"] and record["advantage"] is not None, record
        several = record["agent_name"] == "kinds_several_sequences"
        assert [s["reward"] is not None for s in record["other_sequences"]] == ([True, True] if several else [])
