"""Tests for data/prepare_math_lighteval.py and the bundled MATH samples."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "data" / "prepare_math_lighteval.py"
SAMPLES_DIR = REPO_ROOT / "data" / "samples"
COLUMNS = ("problem", "level", "type", "solution")
TOP_LEVEL_KEYS = {"data_source", "agent_name", "agent_cfg_path", "prompt", "ability", "reward_model", "extra_info"}


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_math_lighteval_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prep = _load_script()

TRAIN_ROWS = [
    ("What is $1+1$?", "Level 1", "Prealgebra", r"Clearly $1+1=\boxed{2}$."),
    ("Halve one.", "Level 2", "Algebra", r"We get $\boxed{\frac{1}{2}}$."),
    ("No box here.", "Level 3", "Geometry", r"The answer is 7, but nobody boxed it."),
    ("Two boxes.", "Level 4", "Number Theory", r"First $\boxed{3}$, then corrected: $\boxed{\sqrt{\frac{9}{4}}}$."),
    ("Framed.", "Level 5", "Counting & Probability", r"So the count is $\fbox{-12}$."),
]
TEST_ROWS = [
    ("What is $2 \\cdot 3$?", "Level 1", "Prealgebra", r"$2 \cdot 3 = \boxed{6}$."),
    ("Decimal?", "Level 1", "Prealgebra", r"It is $\boxed{0.5}$."),
]


def _write_split(path: Path, rows, columns=COLUMNS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {c: [r[COLUMNS.index(c)] for r in rows] for c in columns}
    pq.write_table(pa.table(data), path)


def _make_dataset(root: Path, layout: str) -> Path:
    if layout == "hub":
        _write_split(root / "data" / "train-00000-of-00001.parquet", TRAIN_ROWS)
        _write_split(root / "data" / "test-00000-of-00001.parquet", TEST_ROWS)
    else:
        _write_split(root / "train.parquet", TRAIN_ROWS)
        _write_split(root / "test.parquet", TEST_ROWS)
    return root


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        (r"$\boxed{5}$", "5"),
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"$\boxed{1}$ no wait $\boxed{\sqrt{2}}$", r"\sqrt{2}"),
        (r"$\boxed{1}$ or $\fbox{2}$", "2"),
        (r"$\fbox{\frac{a}{b}}$ then $\boxed{x^{2}}$", "x^{2}"),
        (r"so $\boxed 7$.", "7"),
        (r"$\boxed{\text{(A)}}$", r"\text{(A)}"),
        ("no box at all", None),
        (r"$\boxed{\frac{1}{2}$", None),  # unbalanced
        ("", None),
    ],
)
def test_extract_last_boxed(solution: str, expected: str | None) -> None:
    assert prep.extract_last_boxed(solution) == expected


def test_ground_truths_are_read_by_the_math_rewards_extractor() -> None:
    from lit_agentrl.rewards.math import extract_boxed_answer

    assert prep.extract_boxed_answer is extract_boxed_answer
    assert prep.extract_last_boxed is extract_boxed_answer


@pytest.mark.parametrize("layout", ["hub", "flat"])
def test_main_converts_both_layouts(tmp_path: Path, layout: str, capsys: pytest.CaptureFixture[str]) -> None:
    input_dir = _make_dataset(tmp_path / "in", layout)
    out_dir = tmp_path / "out" / "nested"  # created by the script

    counts = prep.main(["--input_dir", str(input_dir), "--local_dir", str(out_dir)])

    assert counts == {"train": 4, "test": 2}
    train = _read_jsonl(out_dir / "train.jsonl")
    test = _read_jsonl(out_dir / "test.jsonl")
    assert len(train) == 4 and len(test) == 2

    row = train[0]
    assert set(row) == TOP_LEVEL_KEYS
    assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert row["agent_name"] == "matheval_agent"
    assert row["agent_cfg_path"] == "configs/agents/math_eval.yaml"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    system, user = (m["content"] for m in row["prompt"])
    assert "mathlighteval_reward" in system and "\\boxed{}" in system
    assert user.startswith("What is $1+1$? ")
    assert "step by step" in user and "mathlighteval_reward" in user and "\\boxed{}" in user
    assert row["reward_model"] == {"style": "rule", "ground_truth": "2"}
    assert row["extra_info"] == {"split": "train", "index": 0, "level": "Level 1", "type": "Prealgebra"}

    # ground truths: nested braces, last box chosen, \fbox; the no-box row (index 2) is skipped
    assert [r["reward_model"]["ground_truth"] for r in train] == [
        "2",
        r"\frac{1}{2}",
        r"\sqrt{\frac{9}{4}}",
        "-12",
    ]
    assert [r["extra_info"]["index"] for r in train] == [0, 1, 3, 4]
    assert {r["extra_info"]["split"] for r in train} == {"train"}
    assert [r["reward_model"]["ground_truth"] for r in test] == ["6", "0.5"]
    assert [r["extra_info"]["split"] for r in test] == ["test", "test"]

    captured = capsys.readouterr()
    assert "skipped 1" in captured.err and "'train'" in captured.err
    assert "row indices: 2" in captured.err
    assert "'test'" not in captured.err  # nothing skipped there
    assert str(out_dir / "train.jsonl") in captured.out
    assert str(out_dir / "test.jsonl") in captured.out


def test_custom_agent_fields(tmp_path: Path) -> None:
    input_dir = _make_dataset(tmp_path / "in", "flat")
    prep.main(
        [
            "--input_dir",
            str(input_dir),
            "--local_dir",
            str(tmp_path / "out"),
            "--agent_name",
            "other_agent",
            "--agent_cfg_path",
            "configs/agents/other.yaml",
        ]
    )
    row = _read_jsonl(tmp_path / "out" / "test.jsonl")[0]
    assert row["agent_name"] == "other_agent"
    assert row["agent_cfg_path"] == "configs/agents/other.yaml"


def test_missing_input_dir_is_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "does_not_exist"
    with pytest.raises(SystemExit) as excinfo:
        prep.main(["--input_dir", str(missing), "--local_dir", str(tmp_path / "out")])
    assert str(missing) in str(excinfo.value.code)
    assert not (tmp_path / "out").exists()


def test_no_parquet_files_is_clear_error(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    with pytest.raises(SystemExit) as excinfo:
        prep.main(["--input_dir", str(tmp_path / "in"), "--local_dir", str(tmp_path / "out")])
    message = str(excinfo.value.code)
    assert "train" in message and str(tmp_path / "in") in message and ".parquet" in message


@pytest.mark.parametrize(("bad_split", "dropped"), [("train", "solution"), ("test", "level")])
def test_missing_column_is_clear_error(tmp_path: Path, bad_split: str, dropped: str) -> None:
    input_dir = tmp_path / "in"
    for split, rows in (("train", TRAIN_ROWS), ("test", TEST_ROWS)):
        columns = tuple(c for c in COLUMNS if not (split == bad_split and c == dropped))
        _write_split(input_dir / f"{split}.parquet", rows, columns=columns)
    with pytest.raises(SystemExit) as excinfo:
        prep.main(["--input_dir", str(input_dir), "--local_dir", str(tmp_path / "out")])
    message = str(excinfo.value.code)
    assert f"'{dropped}'" in message and f"{bad_split}.parquet" in message
    assert not (tmp_path / "out").exists()  # validated before anything is written


def test_script_runs_standalone(tmp_path: Path) -> None:
    import subprocess

    input_dir = _make_dataset(tmp_path / "in", "hub")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--input_dir", str(input_dir), "--local_dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "skipped 1" in result.stderr
    assert len(_read_jsonl(tmp_path / "out" / "train.jsonl")) == 4


@pytest.mark.parametrize(("name", "expected_rows"), [("train", 24), ("test", 8)])
def test_bundled_samples(name: str, expected_rows: int) -> None:
    rows = _read_jsonl(SAMPLES_DIR / f"math_sample_{name}.jsonl")
    assert len(rows) == expected_rows
    for i, row in enumerate(rows):
        assert set(row) == TOP_LEVEL_KEYS
        assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
        assert row["agent_name"] == "matheval_agent"
        assert row["agent_cfg_path"] == "configs/agents/math_eval.yaml"
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert all(isinstance(m["content"], str) and m["content"] for m in row["prompt"])
        assert "mathlighteval_reward" in row["prompt"][1]["content"]
        assert row["reward_model"]["style"] == "rule"
        gt = row["reward_model"]["ground_truth"]
        assert isinstance(gt, str) and gt.strip()
        info = row["extra_info"]
        assert info["split"] == name and info["index"] == i
        assert info["level"] and info["type"]
