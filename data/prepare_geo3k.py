"""Convert the Geometry3K parquet dataset into agent-task JSONL files (the seed's ``geo3k_agent.py`` preprocessing).

Usage:
    python data/prepare_geo3k.py --input_dir DIR --local_dir DIR \
        [--agent_name geo3k_agent] [--agent_cfg_path configs/agents/geo3k.yaml]

``--input_dir`` is a local copy of ``hiyouga/geometry3k``: parquet files for the ``train`` and ``test`` splits, in
the Hub layout (``data/train-00000-of-00001.parquet``) or flat (``train.parquet``). Required columns: ``images``
(a list of ``{"bytes", "path"}`` images), ``problem`` (with an ``<image>`` placeholder where the figure goes) and
``answer``.

For each split a ``<split>.jsonl`` file is written into ``--local_dir``, and the split's images into
``--local_dir/images/<split>/`` (one file per image, named ``<index>-<k>`` with the image's own format suffix);
each line is one row, laid out as the seed's ``geo3k_agent.py`` writes its rows::

    {"data_source": "hiyouga/geometry3k",
     "agent_name": "geo3k_agent",
     "agent_cfg_path": "configs/agents/geo3k.yaml",
     "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": [{"type": "image", "image": "/abs/local_dir/images/train/0-0.png"},
                                             {"type": "text", "text": problem + " " + INSTRUCTION}]}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": answer},
     "extra_info": {"split": "train", "index": i, "answer": answer, "question": problem}}

The figures go first in the user turn, as image parts, and the problem's ``<image>`` placeholders are removed from
its text. Images are stored as absolute paths (the seed embeds them as base64 JPEG; files keep the JSONL small and
the pictures viewable), so the rows work from any working directory; move the folder and rerun the script. The
prompt asks the model to reason in ``<think>`` tags, to check its answer with the agent's ``calc_geo3k_reward`` tool
and to answer in ``\\boxed{}``. Rows with no answer or with an image that has neither bytes nor an existing file are
skipped and reported on stderr. ``data_source`` selects the ``geo3k`` reward. The script needs ``pyarrow`` (and
``hf_parquet.py`` beside it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # hf_parquet.py, also when loaded by path

from hf_parquet import RowFn, agent_fields, make_parser, prepare_splits, task_row

DATA_SOURCE = "hiyouga/geometry3k"
DEFAULT_AGENT_NAME = "geo3k_agent"
DEFAULT_AGENT_CFG_PATH = "configs/agents/geo3k.yaml"
REQUIRED_COLUMNS: tuple[str, ...] = ("images", "problem", "answer")
IMAGE_PLACEHOLDER = "<image>"

SYSTEM_PROMPT = (
    "You are a math expert who solves geometry problems from their figures. Reason step by step before any tool "
    "call. Check your answer with the `calc_geo3k_reward` tool at least once before you give the final answer, and "
    "correct it if the tool says it is wrong. Put the final answer within \\boxed{}."
)
INSTRUCTION = (
    "Think the problem through step by step inside <think> </think> tags first, check your answer with the "
    "`calc_geo3k_reward` tool, then give the final answer within \\boxed{}."
)

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", ".png"),
    (b"\xff\xd8\xff", ".jpg"),
    (b"GIF8", ".gif"),
    (b"BM", ".bmp"),
)
_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp"})


def image_suffix(data: bytes, name: str | None) -> str:
    """The file suffix of an image: its own name's, else read from its first bytes (``.bin`` if unknown)."""
    suffix = Path(name).suffix.lower() if name else ""
    if suffix in _SUFFIXES:
        return suffix
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    return next((ext for magic, ext in _MAGIC if data.startswith(magic)), ".bin")


def save_images(images: Any, input_dir: Path, folder: Path, index: int) -> list[str] | None:
    """Write one row's images into ``folder``; their absolute paths, or None when an image has no data."""
    paths: list[str] = []
    for k, image in enumerate(images or []):
        data, name = (image.get("bytes"), image.get("path")) if isinstance(image, dict) else (None, None)
        if not data:  # no bytes: a file the parquet points to, next to the dataset
            source = input_dir / name if name else None
            if source is None or not source.is_file():
                return None
            data = source.read_bytes()
        target = folder / f"{index}-{k}{image_suffix(data, name)}"
        target.write_bytes(data)
        paths.append(str(target.resolve()))
    return paths


def make_row(
    index: int,
    record: dict[str, Any],
    /,
    *,
    split: str,
    input_dir: Path,
    image_dir: Path,
    agent_name: str = DEFAULT_AGENT_NAME,
    agent_cfg_path: str = DEFAULT_AGENT_CFG_PATH,
) -> dict[str, Any] | None:
    """One output row from a source record, its images saved into ``image_dir``; None with no answer or image data."""
    answer = str(record.get("answer") or "").strip()
    images = save_images(record.get("images"), input_dir, image_dir, index) if answer else None
    if images is None:
        return None
    problem = str(record["problem"]).strip()
    text = problem.replace(IMAGE_PLACEHOLDER, "").strip()
    figures: list[dict[str, Any]] = [{"type": "image", "image": path} for path in images]
    return task_row(
        data_source=DATA_SOURCE,
        agent_name=agent_name,
        agent_cfg_path=agent_cfg_path,
        system=SYSTEM_PROMPT,
        user=[*figures, {"type": "text", "text": f"{text} {INSTRUCTION}"}],
        ability="math",
        ground_truth=answer,
        extra_info={"split": split, "index": index, "answer": answer, "question": problem},
    )


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """CLI entry point; returns ``{split: rows_written}``."""
    parser = make_parser(
        "Convert Geometry3K parquet files to agent-task JSONL and images.",
        DATA_SOURCE,
        DEFAULT_AGENT_NAME,
        DEFAULT_AGENT_CFG_PATH,
    )
    args = parser.parse_args(argv)
    input_dir = Path(args.input_dir).expanduser()

    def row_fn(split: str, local_dir: Path) -> RowFn:
        image_dir = local_dir / "images" / split
        image_dir.mkdir(parents=True, exist_ok=True)
        return partial(make_row, split=split, input_dir=input_dir, image_dir=image_dir, **agent_fields(args))

    why = "with no 'answer' or an image without data"
    return prepare_splits(args, DATA_SOURCE, REQUIRED_COLUMNS, row_fn, why)


if __name__ == "__main__":
    main()
