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
stderr.  The script needs ``pyarrow``, ``lit_agentrl`` (installed, or the
checkout this file sits in) and ``hf_parquet.py`` beside it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if importlib.util.find_spec("lit_agentrl") is None:  # run from a checkout where the package is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # hf_parquet.py, also when loaded by path

from hf_parquet import agent_fields, bind_split, make_parser, prepare_splits, task_row

from lit_agentrl.rewards.boxed import extract_boxed_answer

extract_last_boxed = extract_boxed_answer  # this script's former name for it

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
DATASET = "MATH-lighteval"
DEFAULT_AGENT_NAME = "matheval_agent"
DEFAULT_AGENT_CFG_PATH = "configs/agents/math_eval.yaml"
REQUIRED_COLUMNS: tuple[str, ...] = ("problem", "level", "type", "solution")

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


def _as_text(value: Any) -> str | None:
    return None if value is None else str(value)


def make_row(
    index: int,
    record: dict[str, Any],
    /,
    *,
    split: str,
    agent_name: str = DEFAULT_AGENT_NAME,
    agent_cfg_path: str = DEFAULT_AGENT_CFG_PATH,
) -> dict[str, Any] | None:
    """One output row from a source record; None when its solution has no boxed answer."""
    ground_truth = extract_boxed_answer(record.get("solution") or "")
    if ground_truth is None:
        return None
    return task_row(
        data_source=DATA_SOURCE,
        agent_name=agent_name,
        agent_cfg_path=agent_cfg_path,
        system=SYSTEM_PROMPT,
        user=f"{str(record['problem']).strip()} {INSTRUCTION}",
        ground_truth=ground_truth,
        ability="math",
        extra_info={
            "split": split,
            "index": index,
            "level": _as_text(record.get("level")),
            "type": _as_text(record.get("type")),
        },
    )


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """CLI entry point; returns ``{split: rows_written}``."""
    parser = make_parser(
        "Convert MATH-lighteval parquet files to agent-task JSONL.", DATASET, DEFAULT_AGENT_NAME, DEFAULT_AGENT_CFG_PATH
    )
    args = parser.parse_args(argv)
    row_fn = bind_split(make_row, **agent_fields(args))
    return prepare_splits(args, DATASET, REQUIRED_COLUMNS, row_fn, "with no \\boxed{} answer in 'solution'")


if __name__ == "__main__":
    main()
