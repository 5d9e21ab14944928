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
(set ``RolloutCallback.reward: math``: the ``data_source`` names no reward). The script needs ``pyarrow`` (and ``hf_parquet.py`` beside it).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # hf_parquet.py, also when loaded by path

from hf_parquet import agent_fields, bind_split, make_parser, prepare_splits, task_row

DATA_SOURCE = "openai/gsm8k"
DATASET = "openai/gsm8k"
DEFAULT_AGENT_NAME = "mathcode_agent"
DEFAULT_AGENT_CFG_PATH = "configs/agents/math_code.yaml"
DEFAULT_SUBSET = "main"
REQUIRED_COLUMNS: tuple[str, ...] = ("question", "answer")

SYSTEM_PROMPT = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "You may write Python code and run it with the `execute_python` tool to check your calculations. "
    "Put your final answer within \\boxed{}."
)
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

_FINAL_ANSWER = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def extract_final_answer(solution: str) -> str | None:
    """The number after the last ``####`` of a GSM8K solution, without thousands separators; None if absent."""
    matches = _FINAL_ANSWER.findall(solution or "")
    return matches[-1].replace(",", "") if matches else None


def make_row(
    index: int,
    record: dict[str, Any],
    /,
    *,
    split: str,
    agent_name: str = DEFAULT_AGENT_NAME,
    agent_cfg_path: str = DEFAULT_AGENT_CFG_PATH,
) -> dict[str, Any] | None:
    """One output row from a source record; None when its answer has no ``#### <number>``."""
    ground_truth = extract_final_answer(str(record.get("answer") or ""))
    if ground_truth is None:
        return None
    question = str(record["question"]).strip()
    return task_row(
        data_source=DATA_SOURCE,
        agent_name=agent_name,
        agent_cfg_path=agent_cfg_path,
        system=SYSTEM_PROMPT,
        user=f"{question} {INSTRUCTION}",
        ground_truth=ground_truth,
        ability="math",
        extra_info={"split": split, "index": index, "answer": record["answer"], "question": question},
    )


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """CLI entry point; returns ``{split: rows_written}``."""
    parser = make_parser(
        "Convert GSM8K parquet files to agent-task JSONL.", DATASET, DEFAULT_AGENT_NAME, DEFAULT_AGENT_CFG_PATH
    )
    parser.add_argument("--subset", default=DEFAULT_SUBSET, help="configuration folder to read (main or socratic)")
    args = parser.parse_args(argv)
    row_fn = bind_split(make_row, **agent_fields(args))
    why = "with no '#### <number>' in 'answer'"
    return prepare_splits(args, DATASET, REQUIRED_COLUMNS, row_fn, why, subset=args.subset)


if __name__ == "__main__":
    main()
