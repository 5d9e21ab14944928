"""reasoning-gym's tasks as rows, scored by the dataset's own score_answer, through lit-agentrl fit."""

from __future__ import annotations

import subprocess
import sys

import pytest
import reasoning_gym
from support import REPO_ROOT, fit_rows

from lit_agentrl.agents.libraries import imports
from lit_agentrl.agents.libraries.reasoning_gym import entry_rows, reasoning_gym_reward
from lit_agentrl.data.validation import row_errors

pytestmark = pytest.mark.slow


def rows(dataset: str, config: dict, size: int, answer_tag: str | None = "answer") -> list[dict]:
    return entry_rows(
        dataset,
        config,
        3,
        size,
        agent_name="single_turn",
        agent_cfg_path=None,
        system_prompt=None,
        answer_tag=answer_tag,
    )


@pytest.mark.parametrize(
    "completion",
    ["<answer>2</answer>", "<answer> 2 </answer>", "no tags 2", "<answer>1</answer><answer>2</answer>", ""],
)
def test_the_reward_is_the_datasets_own_score_of_the_tagged_answer(completion):
    dataset = reasoning_gym.create_dataset("gcd", seed=3, size=4, max_value=20)
    for index, row in enumerate(rows("gcd", {"max_value": 20}, 4)):
        truth = row["reward_model"]["ground_truth"]
        answer = reasoning_gym.utils.extract_answer(completion)
        expected = dataset.score_answer(answer, dataset[index])
        assert reasoning_gym_reward(completion, truth) == expected


def test_bare_answers_are_scored_whole_with_the_datasets_partial_credit():
    (row,) = rows("count_bits", {"max_n": 15}, 1, answer_tag=None)
    truth = row["reward_model"]["ground_truth"]
    assert reasoning_gym_reward(f" {truth['answer']}\n", truth) == 1.0
    assert reasoning_gym_reward(f"9 {truth['answer']}", truth) == pytest.approx(1 / 3)  # len(answer) / len("9 a")


def test_a_row_whose_entry_regenerates_differently_is_refused_at_setup(tmp_path):
    (row,) = rows("count_bits", {"max_n": 15}, 1)
    row["reward_model"]["ground_truth"]["question"] = "How many 1 bits are there in 99?"
    (error,) = row_errors(row, tmp_path, None)
    assert "generates with another question" in error and "PYTHONHASHSEED" in error
    row["reward_model"]["ground_truth"] |= {"dataset": "no_such_dataset"}
    assert "cannot be generated here" in row_errors(row, tmp_path, None)[0]
    del row["reward_model"]["ground_truth"]["index"]
    assert "must be a mapping with the keys" in row_errors(row, tmp_path, None)[0]


def test_a_missing_library_is_refused_at_setup_naming_the_extra(tmp_path, monkeypatch):
    (row,) = rows("count_bits", {"max_n": 15}, 1)
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    imports.library_problem.cache_clear()
    try:
        (error,) = row_errors(row, tmp_path, None)
    finally:
        imports.library_problem.cache_clear()
    assert "needs the library 'reasoning_gym'" in error and "pip install 'lit-agentrl[reasoning-gym]'" in error


def test_the_preparation_script_writes_train_and_validation_rows_apart(tmp_path):
    command = [sys.executable, str(REPO_ROOT / "data/prepare_reasoning_gym.py"), "--dataset", "gcd"]
    command += ["--config", '{"max_value": 20}', "--train_size", "5", "--val_size", "3", "--local_dir", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, env={"PYTHONPATH": str(REPO_ROOT), "PATH": ""})
    train = (tmp_path / "train.jsonl").read_text().splitlines()
    val = (tmp_path / "val.jsonl").read_text().splitlines()
    assert len(train) == 5 and len(val) == 3
    assert '"seed": 1000001' in val[0] and "<answer>" in train[0]  # the validation seed, the default system prompt


def test_a_fit_scores_every_trajectory_as_the_library_does(tmp_path, tiny_model_dir):
    task = rows("gcd", {"max_value": 20}, 4, answer_tag=None)
    metrics, records = fit_rows(tmp_path, tiny_model_dir, task, steps=2, max_new_tokens=4)
    dataset = reasoning_gym.create_dataset("gcd", seed=3, size=4, max_value=20)
    train = [r for r in records if r["split"] == "train"]
    assert len(train) == 2 * 4 * 2 and not any(r["failed"] for r in records)
    for record in records:
        entry = dataset[record["ground_truth"]["index"]]
        assert record["reward"] == dataset.score_answer(record["str_output"].strip(), entry)
    assert all(float(m["rollout/failed"]) == 0.0 for m in metrics if m.get("rollout/failed"))
