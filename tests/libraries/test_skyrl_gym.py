"""SkyRL-gym's shipped text environments, SkyRL's rows unchanged, played through lit-agentrl fit."""

from __future__ import annotations

import pytest
import skyrl_gym
from omegaconf import OmegaConf
from support import fit_rows

from lit_agentrl.agents.libraries.skyrl_gym import SkyRLGymEnvironment
from lit_agentrl.data.validation import row_errors

pytestmark = pytest.mark.slow


def row(index: int, env_class: str, answer: str, **extras) -> dict:
    """A row as SkyRL's gsm8k preparation writes it (data_source, prompt, env_class, reward_spec, extra_info)."""
    question = f"Question {index}: what is {answer} plus zero?"
    return {
        "data_source": "openai/gsm8k",
        "agent_name": "skyrl_gym",
        "prompt": [{"role": "user", "content": question}],
        "env_class": env_class,
        "reward_spec": {"method": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index},
        **extras,
    }


def library_rewards(game: dict, actions: list[str]) -> list[float]:
    """The environment stepped directly with ``actions``: its reward for each."""
    env = skyrl_gym.make(game["env_class"], env_config=OmegaConf.create({}), extras=game)
    env.init(game["prompt"])
    return [float(env.step(action)["reward"] or 0.0) for action in actions]


async def test_the_multi_turn_environment_answers_and_ends_as_skyrl_gym_does():
    env = SkyRLGymEnvironment(None)
    game = row(0, "gsm8k_multi_turn", "72", max_turns=3)
    conversation = await env.reset({**game, "messages": game["prompt"]})
    assert conversation == game["prompt"]
    first = await env.step("I think #### 70")
    assert first[0][0]["role"] == "user" and "#### ANSWER" in first[0][0]["content"] and not first[2]
    last = await env.step("#### 72")
    assert last == ([], 1.0, True)
    assert [first[1], last[1]] == library_rewards(game, ["I think #### 70", "#### 72"])
    assert env.metrics == {"steps": 2.0}


def test_rows_are_checked_at_setup_and_need_no_reward_function(tmp_path):
    assert row_errors(row(0, "gsm8k", "72"), tmp_path, None) == []  # data_source gsm8k: no math reward applies
    (unknown,) = row_errors(row(0, "gsm8k_typo", "72"), tmp_path, None)
    assert "'gsm8k_typo' is not a registered SkyRL-gym environment" in unknown and "'gsm8k_multi_turn'" in unknown
    (missing,) = row_errors({**row(0, "gsm8k", "72"), "env_class": None}, tmp_path, None)
    assert "field 'env_class' is missing" in missing


def test_a_fit_trains_single_and_multi_turn_environments_scored_as_skyrl_gym_scores_them(tmp_path, tiny_model_dir):
    games = [row(0, "gsm8k", "72"), row(1, "gsm8k", "5"), row(2, "gsm8k_multi_turn", "8", max_turns=3)]
    games.append(row(3, "gsm8k_multi_turn", "13", max_turns=2))
    metrics, records = fit_rows(tmp_path, tiny_model_dir, games, steps=2, max_new_tokens=6)
    assert not any(r["failed"] for r in records) and len(records) == 2 * 4 * 2 + 4
    by_prompt = {game["prompt"][0]["content"]: game for game in games}
    for record in records:
        game = by_prompt[record["prompt"][0]["content"]]
        actions = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        assert len(actions) == game.get("max_turns", 1)  # the random model never answers: each plays to its limit
        assert record["turn_rewards"] == library_rewards(game, actions)
    assert any(m.get("agent/skyrl_gym/steps") for m in metrics)


def test_skyrls_own_parquet_trains_unchanged_with_row_defaults(tmp_path):
    """SkyRL's preparation scripts write parquet rows without an agent: data.row_defaults names it for every row."""
    import pandas as pd

    from lit_agentrl.data import AgentPromptDataModule
    from lit_agentrl.errors import UserInputError

    skyrl_rows = [{k: v for k, v in row(i, "gsm8k", str(i)).items() if k != "agent_name"} for i in range(4)]
    pd.DataFrame(skyrl_rows).to_parquet(tmp_path / "train.parquet")
    with pytest.raises(UserInputError, match="agent_name"):
        AgentPromptDataModule(str(tmp_path / "train.parquet"), prompts_per_step=2).setup("fit")
    data = AgentPromptDataModule(
        str(tmp_path / "train.parquet"), prompts_per_step=2, row_defaults={"agent_name": "skyrl_gym"}
    )
    data.setup("fit")
    (batch,) = [next(iter(data.train_dataloader()))]
    assert [r["agent_name"] for r in batch.rows] == ["skyrl_gym"] * 2
    assert {r["env_class"] for r in batch.rows} == {"gsm8k"}
