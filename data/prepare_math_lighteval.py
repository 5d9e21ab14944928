"""Convert the MATH-lighteval parquet dataset into agent-task JSONL files.

Usage:
    python data/prepare_math_lighteval.py --input_dir DIR --local_dir DIR \
        [--agent_name matheval_agent] [--agent_cfg_path configs/agents/math_eval.yaml]

``--input_dir`` is a local copy of ``DigitalLearningGmbH/MATH-lighteval``: a
directory holding parquet files for the ``train`` and ``test`` splits, either
in the Hub layout (``data/train-00000-of-00001.parquet``) or flat
(``train.parquet``).  Sharded splits (``train-00000-of-00002.parquet`` ...) are
concatenated in file-name order.  Required columns: ``problem``, ``level``,
``type``, ``solution``.

For each split a ``<split>.jsonl`` file is written into ``--local_dir``; each
line is one row::

    {"data_source": "DigitalLearningGmbH/MATH-lighteval",
     "agent_name": "matheval_agent",
     "agent_cfg_path": "configs/agents/math_eval.yaml",
     "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": problem + " " + INSTRUCTION}],
     "reward_model": {"style": "rule", "ground_truth": <last boxed answer>},
     "extra_info": {"split": "train", "index": i, "level": ..., "type": ...}}

``index`` is the row's position in the source split, so skipped rows leave
gaps.  The ground truth is the content of the last ``\\boxed{...}`` (or
``\\fbox{...}``) in ``solution``, read by the ``math`` reward's own extractor
(:mod:`lit_agentrl.rewards.boxed`); rows without one are skipped and reported on
stderr.  The script needs ``pyarrow`` and ``lit_agentrl`` (installed, or the
checkout this file sits in).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

if importlib.util.find_spec("lit_agentrl") is None:  # run from a checkout where the package is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_agentrl.rewards.boxed import extract_boxed_answer

extract_last_boxed = extract_boxed_answer  # this script's former name for it

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
DEFAULT_AGENT_NAME = "matheval_agent"
DEFAULT_AGENT_CFG_PATH = "configs/agents/math_eval.yaml"
SPLITS: tuple[str, ...] = ("train", "test")
REQUIRED_COLUMNS: tuple[str, ...] = ("problem", "level", "type", "solution")
MAX_REPORTED_INDICES = 5

SYSTEM_PROMPT = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reasoning step by step before any tool call. "
    "You should use the `mathlighteval_reward` tool after step by step solving the question, "
    "before generate final answer at least once and refine your answer if necessary. "
    "Put your final answer within \\boxed{}."
)

INSTRUCTION = (
    "Let's think step by step and output the final answer within \\boxed{}. "
    "You must use the `mathlighteval_reward` tool after step by step solving the question"
)


def find_split_files(input_dir: Path, split: str) -> list[Path]:
    """Return the parquet files of ``split`` under ``input_dir`` (sorted).

    A file belongs to ``split`` when its stem is ``split`` or starts with
    ``split-`` (``train.parquet``, ``data/train-00000-of-00001.parquet``), or
    when it sits in a directory named ``split`` (``train/0000.parquet``).
    """
    input_dir = Path(input_dir)
    if not input_dir.is_dir():
        raise SystemExit(
            f"error: input directory {input_dir} does not exist or is not a directory; "
            "expected a local copy of MATH-lighteval with train/test parquet files"
        )
    files = []
    for path in input_dir.rglob("*.parquet"):
        stem = path.stem
        parents = path.relative_to(input_dir).parent.parts
        in_split_dir = bool(parents) and parents[-1] == split
        if stem == split or stem.startswith(f"{split}-") or in_split_dir:
            files.append(path)
    if not files:
        raise SystemExit(
            f"error: no parquet files for split '{split}' under {input_dir}; expected "
            f"'data/{split}-00000-of-00001.parquet' or '{split}.parquet'"
        )
    return sorted(files)


def _as_text(value: Any) -> str | None:
    return None if value is None else str(value)


def make_row(
    record: dict[str, Any],
    *,
    split: str,
    index: int,
    ground_truth: str,
    agent_name: str = DEFAULT_AGENT_NAME,
    agent_cfg_path: str = DEFAULT_AGENT_CFG_PATH,
) -> dict[str, Any]:
    """Build one output row from a source record and its extracted answer."""
    problem = str(record["problem"]).strip()
    return {
        "data_source": DATA_SOURCE,
        "agent_name": agent_name,
        "agent_cfg_path": agent_cfg_path,
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{problem} {INSTRUCTION}"},
        ],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {
            "split": split,
            "index": index,
            "level": _as_text(record.get("level")),
            "type": _as_text(record.get("type")),
        },
    }


def check_columns(files: Iterable[Path]) -> None:
    """Fail with a clear message if a parquet file lacks a required column."""
    import pyarrow.parquet as pq

    for path in files:
        try:
            names = pq.read_schema(path).names
        except Exception as exc:  # pyarrow raises several error types
            raise SystemExit(f"error: cannot read parquet file {path}: {exc}") from exc
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise SystemExit(
                f"error: {path} is missing column(s) {', '.join(repr(c) for c in missing)}; "
                f"expected columns {list(REQUIRED_COLUMNS)}, found {names}"
            )


def read_records(files: Sequence[Path]) -> list[dict[str, Any]]:
    """Read parquet ``files`` in order, keeping only the required columns."""
    import pyarrow.parquet as pq

    check_columns(files)
    records: list[dict[str, Any]] = []
    for path in files:
        try:
            table = pq.read_table(path, columns=list(REQUIRED_COLUMNS))
        except Exception as exc:  # pyarrow raises several error types
            raise SystemExit(f"error: cannot read parquet file {path}: {exc}") from exc
        records.extend(table.to_pylist())
    return records


def convert_split(
    files: Sequence[Path],
    split: str,
    output_path: Path,
    *,
    agent_name: str = DEFAULT_AGENT_NAME,
    agent_cfg_path: str = DEFAULT_AGENT_CFG_PATH,
) -> int:
    """Convert one split to JSONL at ``output_path``; return rows written.

    Rows with no boxed answer are skipped and reported on stderr.
    """
    records = read_records(files)
    skipped: list[int] = []
    written = 0
    output_path.parent.mkdir(parents=True, exist_ok=True)
    with output_path.open("w", encoding="utf-8") as fh:
        for index, record in enumerate(records):
            ground_truth = extract_boxed_answer(record.get("solution") or "")
            if ground_truth is None:
                skipped.append(index)
                continue
            row = make_row(
                record,
                split=split,
                index=index,
                ground_truth=ground_truth,
                agent_name=agent_name,
                agent_cfg_path=agent_cfg_path,
            )
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            written += 1
    if skipped:
        shown = ", ".join(str(i) for i in skipped[:MAX_REPORTED_INDICES])
        more = "" if len(skipped) <= MAX_REPORTED_INDICES else ", ..."
        print(
            f"warning: split '{split}': skipped {len(skipped)} of {len(records)} row(s) "
            f"with no \\boxed{{}} answer in 'solution' (row indices: {shown}{more})",
            file=sys.stderr,
        )
    return written


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Convert MATH-lighteval parquet files to agent-task JSONL.")
    parser.add_argument("--input_dir", required=True, help="local MATH-lighteval directory")
    parser.add_argument("--local_dir", required=True, help="output directory (created if missing)")
    parser.add_argument("--agent_name", default=DEFAULT_AGENT_NAME)
    parser.add_argument("--agent_cfg_path", default=DEFAULT_AGENT_CFG_PATH)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """CLI entry point; returns ``{split: rows_written}``."""
    args = parse_args(argv)
    input_dir = Path(args.input_dir).expanduser()
    local_dir = Path(args.local_dir).expanduser()
    split_files = {split: find_split_files(input_dir, split) for split in SPLITS}
    for files in split_files.values():  # validate every split before writing anything
        check_columns(files)
    local_dir.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for split in SPLITS:
        output_path = local_dir / f"{split}.jsonl"
        counts[split] = convert_split(
            split_files[split],
            split,
            output_path,
            agent_name=args.agent_name,
            agent_cfg_path=args.agent_cfg_path,
        )
        print(f"wrote {counts[split]} rows to {output_path}")
    return counts


if __name__ == "__main__":
    main()
