"""Tests for data/prepare_geo3k.py on small parquet files with PNG images, in the Hub's layout."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
Image = pytest.importorskip("PIL.Image")

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "data" / "prepare_geo3k.py"
TOP_LEVEL_KEYS = {"data_source", "agent_name", "agent_cfg_path", "prompt", "ability", "reward_model", "extra_info"}


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_geo3k_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prep = _load_script()


def _image_bytes(color: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buffer, format=fmt)
    return buffer.getvalue()


RED, BLUE = _image_bytes((255, 0, 0)), _image_bytes((0, 0, 255), "JPEG")
TRAIN_ROWS = [
    ([{"bytes": RED, "path": None}], "<image>Find x.", "3\\sqrt{3}"),
    ([{"bytes": BLUE, "path": "figure.jpg"}, {"bytes": RED, "path": None}], "<image><image>Find the area.", "60"),
    ([{"bytes": RED, "path": None}], "<image>No answer.", ""),
    ([{"bytes": None, "path": None}], "<image>Lost figure.", "5"),
]
TEST_ROWS = [([{"bytes": RED, "path": None}], "<image>Find y.", "\\frac{5}{2}")]


def _write_split(path: Path, rows, columns=("images", "problem", "answer")) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    names = ("images", "problem", "answer")
    pq.write_table(pa.table({c: [r[names.index(c)] for r in rows] for c in columns}), path)


def _make_dataset(root: Path) -> Path:
    _write_split(root / "data" / "train-00000-of-00001.parquet", TRAIN_ROWS)
    _write_split(root / "data" / "validation-00000-of-00001.parquet", TEST_ROWS)
    _write_split(root / "data" / "test-00000-of-00001.parquet", TEST_ROWS)
    return root


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_main_writes_rows_and_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out" / "nested"
    counts = prep.main(["--input_dir", str(_make_dataset(tmp_path / "in")), "--local_dir", str(out)])

    assert counts == {"train": 2, "test": 1}
    train = _read_jsonl(out / "train.jsonl")
    row = train[0]
    assert set(row) == TOP_LEVEL_KEYS
    assert row["data_source"] == "hiyouga/geometry3k"
    assert (row["agent_name"], row["agent_cfg_path"]) == ("geo3k_agent", "configs/agents/geo3k.yaml")
    # The seed's layout: a system turn, then the figures as image parts before the problem's text (<image> removed).
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][0]["content"] == prep.SYSTEM_PROMPT and "calc_geo3k_reward" in prep.SYSTEM_PROMPT
    figure, text = row["prompt"][1]["content"]
    assert figure == {"type": "image", "image": str((out / "images" / "train" / "0-0.png").resolve())}
    assert text["type"] == "text" and text["text"] == f"Find x. {prep.INSTRUCTION}" and "\\boxed{}" in text["text"]
    assert row["ability"] == "math"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "3\\sqrt{3}"}
    assert row["extra_info"] == {"split": "train", "index": 0, "answer": "3\\sqrt{3}", "question": "<image>Find x."}
    assert [r["extra_info"]["index"] for r in train] == [0, 1]

    parts = train[1]["prompt"][1]["content"]
    assert [part["type"] for part in parts] == ["image", "image", "text"]
    paths = [Path(part["image"]) for part in parts[:2]]
    assert [p.name for p in paths] == ["1-0.jpg", "1-1.png"] and all(p.is_absolute() for p in paths)
    assert paths[0].read_bytes() == BLUE and paths[1].read_bytes() == RED
    with Image.open(paths[1]) as image:
        assert image.size == (8, 6)
    assert "skipped 2 of 4" in capsys.readouterr().err
    assert not (out / "images" / "train" / "2-0.png").exists()  # a skipped row leaves no image behind


def test_images_without_bytes_are_read_from_their_path(tmp_path: Path) -> None:
    root = tmp_path / "in"
    (root / "figs").mkdir(parents=True)
    (root / "figs" / "a.png").write_bytes(RED)
    _write_split(root / "train.parquet", [([{"bytes": None, "path": "figs/a.png"}], "<image>Find z.", "4")])
    _write_split(root / "test.parquet", TEST_ROWS)
    prep.main(["--input_dir", str(root), "--local_dir", str(tmp_path / "out")])
    (row,) = _read_jsonl(tmp_path / "out" / "train.jsonl")
    assert Path(row["prompt"][1]["content"][0]["image"]).read_bytes() == RED


def test_rows_pass_the_data_checks_and_select_the_geo3k_reward(tmp_path: Path) -> None:
    from lit_agentrl.agents import AgentGraph, register
    from lit_agentrl.data import load_and_validate
    from lit_agentrl.rewards import get_reward_fn, resolve_reward_fn

    @register("geo3k_agent_under_test")
    class _Geo3k(AgentGraph):
        async def run(self, messages, sampling_params, **kwargs):
            raise NotImplementedError

    prep.main(
        [
            "--input_dir",
            str(_make_dataset(tmp_path / "in")),
            "--local_dir",
            str(tmp_path / "out"),
            "--agent_name",
            "geo3k_agent_under_test",
            "--agent_cfg_path",
            "",
        ]
    )
    rows = load_and_validate([str(tmp_path / "out" / "train.jsonl")], reward_fn=None)
    assert len(rows) == 2
    assert resolve_reward_fn(rows[0], None) is get_reward_fn("geo3k")
    assert get_reward_fn("geo3k")("so x = \\boxed{3\\sqrt{3}}", rows[0]["reward_model"]["ground_truth"]) > 0.8


@pytest.mark.parametrize(
    ("data", "name", "suffix"),
    [(RED, None, ".png"), (BLUE, None, ".jpg"), (b"GIF89a...", None, ".gif"), (b"????", "x.webp", ".webp")],
)
def test_image_suffix(data: bytes, name: str | None, suffix: str) -> None:
    assert prep.image_suffix(data, name) == suffix


def test_missing_column_is_clear_error(tmp_path: Path) -> None:
    _write_split(tmp_path / "in" / "train.parquet", TRAIN_ROWS, columns=("problem", "answer"))
    _write_split(tmp_path / "in" / "test.parquet", TEST_ROWS)
    with pytest.raises(SystemExit) as excinfo:
        prep.main(["--input_dir", str(tmp_path / "in"), "--local_dir", str(tmp_path / "out")])
    assert "'images'" in str(excinfo.value.code)
    assert not (tmp_path / "out").exists()


def test_script_runs_standalone(tmp_path: Path) -> None:
    input_dir = _make_dataset(tmp_path / "in")
    args = [sys.executable, str(SCRIPT), "--input_dir", str(input_dir), "--local_dir", str(tmp_path / "out")]
    result = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(_read_jsonl(tmp_path / "out" / "test.jsonl")) == 1
