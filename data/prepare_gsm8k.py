"""Convert the GSM8K parquet dataset into agent-task JSONL files (the seed's ``gsm8k_agent.py`` preprocessing).

Usage:
    python data/prepare_gsm8k.py --input_dir DIR --local_dir DIR \
        [--agent_name mathcode_agent] [--agent_cfg_path configs/agents/math_code.yaml] [--subset main]

``--input_dir`` is a local copy of ``openai/gsm8k``: parquet files for the ``train`` and ``test`` splits, in the
Hub layout (``main/train-00000-of-00001.parquet``; with ``socratic/`` beside it, ``--subset`` picks the folder) or
flat (``train.parquet``). Required columns: ``question``, ``answer`` (the worked solution, ending ``#### N``).

For each split a ``<split>.jsonl`` file is written into ``--local_dir``; each line is one row::

    {"data_source": "openai/gsm8k",
     "agent_name": "mathcode_agent",
     "agent_cfg_path": "configs/agents/math_code.yaml",
     "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": question + " " + INSTRUCTION}],
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": i, "answer": <solution>, "question": question}}

The ground truth is the number after the last ``####`` with thousands separators removed; rows without one are
skipped and reported on stderr. The prompt asks for the answer in ``\\boxed{}``, which the ``math`` reward reads
(set ``data.reward_fn: math``: the ``data_source`` names no reward). The script needs ``pyarrow`` (and ``hf_parquet.py`` beside it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # hf_parquet.py, also when loaded by path

from hf_parquet import check_columns, find_split_files, read_records, report_skipped

DATA_SOURCE = "openai/gsm8k"
DATASET = "openai/gsm8k"
DEFAULT_AGENT_NAME = "mathcode_agent"
DEFAULT_AGENT_CFG_PATH = "configs/agents/math_code.yaml"
DEFAULT_SUBSET = "main"
SPLITS: tuple[str, ...] = ("train", "test")
REQUIRED_COLUMNS: tuple[str, ...] = ("question", "answer")

SYSTEM_PROMPT = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "You may write Python code and run it with the `python_exec` tool to check your calculations. "
    "Put your final answer within \\boxed{}."
)
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

_FINAL_ANSWER = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def extract_final_answer(solution: str) -> str | None:
    """The number after the last ``####`` of a GSM8K solution, without thousands separators; None if absent."""
    matches = _FINAL_ANSWER.findall(solution or "")
    return matches[-1].replace(",", "") if matches else None


def make_row(
    record: dict[str, Any],
    *,
    split: str,
    index: int,
    ground_truth: str,
    agent_name: str = DEFAULT_AGENT_NAME,
    agent_cfg_path: str = DEFAULT_AGENT_CFG_PATH,
) -> dict[str, Any]:
    """One output row from a source record and its final answer."""
    question = str(record["question"]).strip()
    return {
        "data_source": DATA_SOURCE,
        "agent_name": agent_name,
        "agent_cfg_path": agent_cfg_path,
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{question} {INSTRUCTION}"},
        ],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": record["answer"], "question": question},
    }


def convert_split(files: Sequence[Path], split: str, output_path: Path, **agent: str) -> int:
    """Convert one split to JSONL at ``output_path``; returns the rows written (rows with no ``####`` are skipped)."""
    records = read_records(files, REQUIRED_COLUMNS)
    skipped: list[int] = []
    output_path.parent.mkdir(parents=True, exist_ok=True)
    with output_path.open("w", encoding="utf-8") as fh:
        for index, record in enumerate(records):
            ground_truth = extract_final_answer(str(record.get("answer") or ""))
            if ground_truth is None:
                skipped.append(index)
                continue
            row = make_row(record, split=split, index=index, ground_truth=ground_truth, **agent)
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    report_skipped(split, skipped, len(records), "with no '#### <number>' in 'answer'")
    return len(records) - len(skipped)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Convert GSM8K parquet files to agent-task JSONL.")
    parser.add_argument("--input_dir", required=True, help="local openai/gsm8k directory")
    parser.add_argument("--local_dir", required=True, help="output directory (created if missing)")
    parser.add_argument("--agent_name", default=DEFAULT_AGENT_NAME)
    parser.add_argument("--agent_cfg_path", default=DEFAULT_AGENT_CFG_PATH)
    parser.add_argument("--subset", default=DEFAULT_SUBSET, help="configuration folder to read (main or socratic)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """CLI entry point; returns ``{split: rows_written}``."""
    args = parse_args(argv)
    input_dir = Path(args.input_dir).expanduser()
    local_dir = Path(args.local_dir).expanduser()
    split_files = {split: find_split_files(input_dir, split, DATASET, args.subset) for split in SPLITS}
    for files in split_files.values():  # validate every split before writing anything
        check_columns(files, REQUIRED_COLUMNS)
    counts: dict[str, int] = {}
    for split in SPLITS:
        output_path = local_dir / f"{split}.jsonl"
        agent = {"agent_name": args.agent_name, "agent_cfg_path": args.agent_cfg_path}
        counts[split] = convert_split(split_files[split], split, output_path, **agent)
        print(f"wrote {counts[split]} rows to {output_path}")
    return counts


if __name__ == "__main__":
    main()
