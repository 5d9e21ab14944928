"""Tests for data/prepare_gsm8k.py on small parquet files in the Hub's layouts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "data" / "prepare_gsm8k.py"
TOP_LEVEL_KEYS = {"data_source", "agent_name", "agent_cfg_path", "prompt", "ability", "reward_model", "extra_info"}


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_gsm8k_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prep = _load_script()

TRAIN_ROWS = [
    ("Tom has 3 apples and buys 4. How many?", "3 + 4 = <<3+4=7>>7\n#### 7"),
    ("A farm sells 1,200 eggs a day. How many in two days?", "1200 * 2 = 2400\n#### 2,400"),
    ("No final answer here.", "It is 5."),
    ("Debt?", "She owes 3.5 dollars.\n#### -3.5"),
]
TEST_ROWS = [("What is 6 times 7?", "6 * 7 = 42\n#### 42")]


def _write_split(path: Path, rows, columns=("question", "answer")) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {c: [r[("question", "answer").index(c)] for r in rows] for c in columns}
    pq.write_table(pa.table(data), path)


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("solution", "expected"),
    [("#### 7", "7"), ("x\n#### 1,234,567", "1234567"), ("#### -3.5", "-3.5"), ("#### 1\n#### 2", "2"), ("7", None)],
)
def test_extract_final_answer(solution: str, expected: str | None) -> None:
    assert prep.extract_final_answer(solution) == expected


def test_main_converts_the_hub_layout_and_reads_main_not_socratic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "in"
    _write_split(root / "main" / "train-00000-of-00001.parquet", TRAIN_ROWS)
    _write_split(root / "main" / "test-00000-of-00001.parquet", TEST_ROWS)
    _write_split(root / "socratic" / "train-00000-of-00001.parquet", TRAIN_ROWS[:1])
    _write_split(root / "socratic" / "test-00000-of-00001.parquet", TEST_ROWS)
    out = tmp_path / "out"

    assert prep.main(["--input_dir", str(root), "--local_dir", str(out)]) == {"train": 3, "test": 1}

    train = _read_jsonl(out / "train.jsonl")
    row = train[0]
    assert set(row) == TOP_LEVEL_KEYS
    assert row["data_source"] == "openai/gsm8k"
    assert (row["agent_name"], row["agent_cfg_path"]) == ("mathcode_agent", "configs/agents/math_code.yaml")
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][1]["content"].startswith("Tom has 3 apples") and "\\boxed{}" in row["prompt"][1]["content"]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert row["extra_info"] == {"split": "train", "index": 0, "answer": TRAIN_ROWS[0][1], "question": TRAIN_ROWS[0][0]}
    assert [r["reward_model"]["ground_truth"] for r in train] == ["7", "2400", "-3.5"]
    assert [r["extra_info"]["index"] for r in train] == [0, 1, 3]
    assert "skipped 1 of 4" in capsys.readouterr().err


def test_rows_pass_the_data_checks_with_the_math_reward(tmp_path: Path) -> None:
    from lit_agentrl.data import load_and_validate
    from lit_agentrl.rewards import resolve_reward_fn

    _write_split(tmp_path / "in" / "train.parquet", TRAIN_ROWS)
    _write_split(tmp_path / "in" / "test.parquet", TEST_ROWS)
    prep.main(["--input_dir", str(tmp_path / "in"), "--local_dir", str(tmp_path / "out")])
    cfg = REPO_ROOT / "configs" / "agents" / "math_code.yaml"
    rows = [dict(r, agent_cfg_path=str(cfg)) for r in _read_jsonl(tmp_path / "out" / "test.jsonl")]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (row,) = load_and_validate([str(data)], reward_fn=None)  # openai/gsm8k selects the math reward, as in the seed
    reward = resolve_reward_fn(row, "math")
    assert reward is not None and reward("so \\boxed{42}", "42") == 1.0


def test_missing_column_is_clear_error(tmp_path: Path) -> None:
    _write_split(tmp_path / "in" / "train.parquet", TRAIN_ROWS, columns=("question",))
    _write_split(tmp_path / "in" / "test.parquet", TEST_ROWS)
    with pytest.raises(SystemExit) as excinfo:
        prep.main(["--input_dir", str(tmp_path / "in"), "--local_dir", str(tmp_path / "out")])
    assert "'answer'" in str(excinfo.value.code) and "train.parquet" in str(excinfo.value.code)
    assert not (tmp_path / "out").exists()


def test_missing_input_dir_names_the_dataset(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as excinfo:
        prep.main(["--input_dir", str(tmp_path / "nope"), "--local_dir", str(tmp_path / "out")])
    assert "openai/gsm8k" in str(excinfo.value.code)


def test_script_runs_standalone(tmp_path: Path) -> None:
    _write_split(tmp_path / "in" / "train.parquet", TRAIN_ROWS)
    _write_split(tmp_path / "in" / "test.parquet", TEST_ROWS)
    args = [sys.executable, str(SCRIPT), "--input_dir", str(tmp_path / "in"), "--local_dir", str(tmp_path / "out")]
    result = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(_read_jsonl(tmp_path / "out" / "train.jsonl")) == 3
