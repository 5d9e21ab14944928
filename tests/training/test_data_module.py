"""AgentPromptDataModule: every row validated before training, clear errors, rank split, resumable position."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import MATH_EVAL_CFG, MATH_SAMPLE_TRAIN

from lit_agentrl.agents import AgentGraph, register
from lit_agentrl.data import AgentPromptDataModule, PromptBatchLoader, load_and_validate, row_errors
from lit_agentrl.errors import UserInputError

GOOD = {
    "agent_name": "matheval_agent",
    "agent_cfg_path": str(MATH_EVAL_CFG),
    "prompt": [{"role": "user", "content": "1+1?"}],
    "reward_model": {"ground_truth": "2"},
    "data_source": "math",
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bundled_samples_validate():
    rows = load_and_validate([str(MATH_SAMPLE_TRAIN)], reward_fn="math")
    assert len(rows) == 24 and all(Path(r["agent_cfg_path"]).is_absolute() for r in rows)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"agent_name": None}, "field 'agent_name' is missing"),
        ({"agent_name": "nobody"}, "unknown agent_name 'nobody'; registered agents:"),
        ({"agent_cfg_path": "configs/agents/nope.yaml"}, "'configs/agents/nope.yaml' not found"),
        ({"prompt": []}, "field 'prompt' is an empty list; the prompt needs at least one message"),
        ({"prompt": [{"content": "hi"}]}, "field 'prompt'[0] must be a message with 'role' and 'content'"),
        ({"prompt": [{"role": "narrator", "content": "hi"}]}, "role 'narrator' is not one of"),
        ({"reward_model": {"ground_truth": None}}, "ground_truth') is missing; the reward function needs it"),
    ],
)
def test_bad_rows_are_named_by_file_line_and_field(tmp_path, change, fragment):
    bad = {**GOOD, **change}
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD, bad])
    with pytest.raises(UserInputError) as info:
        load_and_validate([str(path)], reward_fn="math")
    message = str(info.value)
    assert f"data file '{path}', line 2: " in message and fragment in message, message
    assert "line 1" not in message


@pytest.mark.parametrize("secret", [None, 12, 2.5])
def test_an_agent_checks_its_own_row_fields_at_setup(tmp_path, secret):
    game = {"agent_name": "guess_digit", "prompt": [{"role": "user", "content": "guess"}], "secret": 4}
    path = write_jsonl(tmp_path / "train.jsonl", [game, {**game, "secret": secret}])
    with pytest.raises(ValueError) as info:
        load_and_validate([str(path)], reward_fn=None)
    message = str(info.value)
    assert f"'{path}', line 2: row field 'secret' must be a digit 0-9 (an integer), got {secret!r}" in message, message
    assert "line 1" not in message  # 4 stays a digit even where the loader made the column float


@register("test_agent_with_required_fields")
class NeedsHint(AgentGraph):
    required_fields = ("hint",)

    async def run(self, messages, sampling_params, **kwargs):
        raise NotImplementedError


def test_fields_an_agent_declares_are_required_of_every_row_at_setup(tmp_path):
    row = {"agent_name": "test_agent_with_required_fields", "prompt": [{"role": "user", "content": "go"}]}
    path = write_jsonl(tmp_path / "train.jsonl", [{**row, "hint": "x"}, row, {**row, "hint": None}])
    with pytest.raises(UserInputError) as info:
        load_and_validate([str(path)], reward_fn=None)
    message = str(info.value)
    assert (
        "2 lines (2, 3): field 'hint' is missing or null; agent 'test_agent_with_required_fields' needs it" in message
    )
    assert "line 1" not in message


def test_row_without_prompt_field(tmp_path):
    row = {k: v for k, v in GOOD.items() if k != "prompt"}
    path = write_jsonl(tmp_path / "train.jsonl", [row])
    with pytest.raises(ValueError, match="no prompt: expected a field named one of"):
        load_and_validate([str(path)], reward_fn="math")


def test_invalid_agent_yaml_is_named(tmp_path):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("max_turns: [1, 2\n")
    path = write_jsonl(tmp_path / "train.jsonl", [{**GOOD, "agent_cfg_path": str(cfg)}])
    with pytest.raises(ValueError, match=re.escape("agent.yaml' is not valid YAML")):
        load_and_validate([str(path)], reward_fn="math")


def test_repeated_mistake_is_reported_once_with_its_rows(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{**GOOD, "agent_name": "nobody"}] * 7)
    with pytest.raises(ValueError) as info:
        load_and_validate([str(path)], reward_fn="math")
    assert "7 lines (1, 2, 3, 4, 5, ...)" in str(info.value)
    assert str(info.value).count("unknown agent_name") == 1


@pytest.mark.parametrize(
    "name, content, fragment",
    [
        ("missing.jsonl", None, "does not exist"),
        ("empty.jsonl", "", "is empty"),
        ("broken.jsonl", '{"agent_name": "x"\n', "line 1: not valid JSON"),
        ("table.csv", "a,b\n", "unsupported extension '.csv'"),
    ],
)
def test_unreadable_files_are_named(tmp_path, name, content, fragment):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserInputError, match=fragment) as info:
        load_and_validate([str(path)], reward_fn="math")
    assert name in str(info.value)


def test_parquet_rows_load(tmp_path):
    import pandas as pd

    path = tmp_path / "train.parquet"
    pd.DataFrame([GOOD, GOOD]).to_parquet(path)
    rows = load_and_validate([str(path)], reward_fn="math")
    assert rows[0]["prompt"][0]["content"] == "1+1?" and rows[0]["reward_model"]["ground_truth"] == "2"


def test_relative_cfg_path_is_found_above_the_data_file(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.yaml").write_text("max_turns: 1\n")
    (tmp_path / "data" / "sub").mkdir(parents=True)
    path = write_jsonl(tmp_path / "data" / "sub" / "train.jsonl", [{**GOOD, "agent_cfg_path": "configs/a.yaml"}])
    monkeypatch.chdir("/")
    rows = load_and_validate([str(path)], reward_fn="math")
    assert rows[0]["agent_cfg_path"] == str(tmp_path / "configs" / "a.yaml")


def loaders(rows: list[dict], world: int, per_step: int, seed: int = 3) -> list[PromptBatchLoader]:
    return [PromptBatchLoader(rows, per_step, seed, True, rank, world, "train") for rank in range(world)]


def test_ranks_get_disjoint_shares_of_each_step_and_cover_the_epoch():
    rows = [{"id": i} for i in range(20)]
    per_rank = [list(loader) for loader in loaders(rows, world=2, per_step=4)]
    assert [len(p) for p in per_rank] == [5, 5]
    seen = []
    for b0, b1 in zip(*per_rank):
        ids0, ids1 = {r["id"] for r in b0.rows}, {r["id"] for r in b1.rows}
        assert len(ids0) == len(ids1) == 2 and not ids0 & ids1 and b0.index == b1.index
        seen += [*ids0, *ids1]
    assert sorted(seen) == list(range(20))


def test_validation_covers_every_row_with_a_partial_last_batch():
    rows = [{"id": i} for i in range(23)]  # 2 full batches of 8 and 7 left over, across 3 ranks
    per_rank = [list(PromptBatchLoader(rows, 8, 0, False, rank, 3, "val", whole_epoch=True)) for rank in range(3)]
    assert [len(p) for p in per_rank] == [3, 3, 3]  # every rank runs every batch (collectives stay in step)
    assert [len(b.rows) for b in (p[2] for p in per_rank)] == [3, 2, 2]
    seen = [r["id"] for p in per_rank for b in p for r in b.rows]
    assert sorted(seen) == list(range(23))
    (train,) = loaders(rows, world=1, per_step=8)
    assert len(train) == 2  # training keeps equal steps: the remainder waits for the next epoch's shuffle


def test_epochs_reshuffle_with_the_seed():
    rows = [{"id": i} for i in range(12)]
    (loader,) = loaders(rows, world=1, per_step=4)
    first = [r["id"] for b in loader for r in b.rows]
    loader.consumed = len(loader)
    second = [r["id"] for b in loader for r in b.rows]
    assert sorted(first) == sorted(second) == list(range(12)) and first != second
    (again,) = loaders(rows, world=1, per_step=4)
    assert [r["id"] for b in again for r in b.rows] == first


def test_position_resumes_from_state_without_repeat_or_skip():
    rows = [{"id": i} for i in range(16)]
    (loader,) = loaders(rows, world=1, per_step=4)
    batches = iter(loader)
    for _ in range(2):
        loader.mark_consumed(next(batches))
    next(batches)  # prefetched, never consumed: must come again after resume
    state = loader.state_dict()
    (fresh,) = loaders(rows, world=1, per_step=4)
    fresh.load_state_dict(state)
    resumed = [b.index for b in fresh]
    assert resumed == [2, 3]


def test_resume_with_other_data_is_refused():
    (loader,) = loaders([{"id": i} for i in range(8)], world=1, per_step=4)
    (other,) = loaders([{"id": i} for i in range(12)], world=1, per_step=4)
    with pytest.raises(ValueError, match="cannot resume the data position"):
        other.load_state_dict(loader.state_dict())


def test_impossible_batch_configurations_fail_at_setup(tmp_path):
    with pytest.raises(ValueError, match="prompts_per_step must be >= 1"):
        AgentPromptDataModule(train_files=str(MATH_SAMPLE_TRAIN), prompts_per_step=0)
    module = AgentPromptDataModule(train_files=str(MATH_SAMPLE_TRAIN), prompts_per_step=64)
    with pytest.raises(ValueError, match=re.escape("24 rows, fewer than data.prompts_per_step=64")):
        module.setup("fit")


def test_the_rollout_s_default_reward_is_checked_against_the_rows_at_setup(tmp_path):
    """RolloutCallback.reward.fn scores rows whose data_source names no reward: an unknown name, or such a row without
    a ground truth, is refused when the callback is set up, naming the key, the file and the line."""
    from lit_agentrl.callbacks.rollout_checks import check_reward
    from lit_agentrl.config.rollout import Rewards

    unscored = {k: v for k, v in GOOD.items() if k not in ("data_source", "reward_model")}
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD, unscored, GOOD])
    module = AgentPromptDataModule(train_files=str(path), prompts_per_step=1)
    module.setup("fit")  # no default reward yet: the second row is scored by none, and loads
    check_reward(Rewards(fn=None), module)
    with pytest.raises(ValueError, match=r"RolloutCallback\.reward\.fn: .*unknown reward 'nope'"):
        check_reward(Rewards(fn="nope"), module)
    with pytest.raises(
        ValueError, match=r"train\.jsonl', line 2: field 'reward_model\.ground_truth' .* is missing"
    ) as err:
        check_reward(Rewards(fn="math"), module)
    assert "RolloutCallback.reward.fn='math'" in str(err.value)


@pytest.mark.parametrize("truth", ["}{", "\\sqrt{", "???"])
def test_ground_truth_the_reward_cannot_parse_is_refused(tmp_path, truth):
    path = write_jsonl(tmp_path / "train.jsonl", [{**GOOD, "reward_model": {"ground_truth": truth}}])
    with pytest.raises(ValueError, match="cannot be parsed by math-verify"):
        load_and_validate([str(path)], reward_fn="math")


def test_overlong_prompts_are_refused_or_skipped_and_counted(tmp_path, tiny_model_dir):
    long = {**GOOD, "prompt": [{"role": "user", "content": "What is " + "1 + " * 200 + "1?"}]}
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD] * 4 + [long] * 2)
    refuse = AgentPromptDataModule(
        train_files=str(path),
        prompts_per_step=2,
        max_prompt_length=64,
        tokenizer_path=str(tiny_model_dir),
    )
    with pytest.raises(ValueError, match=re.escape("2 of 6 prompts are longer than data.max_prompt_length=64")):
        refuse.setup("fit")
    skip = AgentPromptDataModule(
        train_files=str(path),
        prompts_per_step=2,
        max_prompt_length=64,
        overlong_prompts="skip",
        tokenizer_path=str(tiny_model_dir),
    )
    skip.setup("fit")
    assert len(skip.train_dataloader().rows) == 4  # the two over the limit skipped


ROW_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)
ROW_KEYS = st.sampled_from(
    ["agent_name", "agent_cfg_path", "prompt", "messages", "reward_model", "ground_truth", "data_source", "x"]
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(ROW_KEYS, ROW_VALUES | st.sampled_from(list(GOOD.values())), max_size=7))
def test_fuzzed_rows_never_crash_validation(row):
    errors = row_errors(row, Path("."), "math")
    assert isinstance(errors, list) and all(isinstance(e, str) for e in errors)
