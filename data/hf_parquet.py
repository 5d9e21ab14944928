"""Shared by the ``prepare_*`` scripts: read a local copy of a Hugging Face dataset's parquet files split by split,
and write each split's agent-task rows as ``<split>.jsonl``.

A file belongs to a split when its stem is the split (``train.parquet``), starts with ``<split>-``
(``data/train-00000-of-00001.parquet``) or when it sits in a folder named after the split (``train/0.parquet``).
Sharded splits are concatenated in file-name order. Every split is found and its columns checked before anything
is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

SPLITS: tuple[str, ...] = ("train", "test")

RowFn = Callable[[int, dict[str, Any]], dict[str, Any] | None]
"""``(index, record) -> row``, or None to skip the record."""
SplitRowFn = Callable[[str, Path], RowFn]
"""``(split, local_dir) -> RowFn``: a split's row maker, called before that split is written."""


def find_split_files(input_dir: Path, split: str, dataset: str, subset: str | None = None) -> list[Path]:
    """The parquet files of ``split`` under ``input_dir`` (sorted); with ``subset`` (a dataset configuration such
    as gsm8k's ``main``), only those under a folder of that name when there are any. Exits naming ``dataset``."""
    input_dir = Path(input_dir)
    if not input_dir.is_dir():
        raise SystemExit(
            f"error: input directory {input_dir} does not exist or is not a directory; "
            f"expected a local copy of {dataset} with train/test parquet files"
        )
    files = [path for path in input_dir.rglob("*.parquet") if _in_split(path.relative_to(input_dir), split)]
    in_subset = [path for path in files if subset in path.relative_to(input_dir).parts[:-1]]
    files = in_subset or files
    if not files:
        raise SystemExit(
            f"error: no parquet files for split '{split}' under {input_dir}; expected "
            f"'data/{split}-00000-of-00001.parquet' or '{split}.parquet'"
        )
    return sorted(files)


def _in_split(relative: Path, split: str) -> bool:
    folders = relative.parent.parts
    return relative.stem == split or relative.stem.startswith(f"{split}-") or (bool(folders) and folders[-1] == split)


def check_columns(files: Sequence[Path], columns: Sequence[str]) -> None:
    """Exit with a clear message when a parquet file lacks one of ``columns``."""
    import pyarrow.parquet as pq

    for path in files:
        try:
            names = pq.read_schema(path).names
        except Exception as exc:  # pyarrow raises several error types
            raise SystemExit(f"error: cannot read parquet file {path}: {exc}") from exc
        missing = [c for c in columns if c not in names]
        if missing:
            raise SystemExit(
                f"error: {path} is missing column(s) {', '.join(repr(c) for c in missing)}; "
                f"expected columns {list(columns)}, found {names}"
            )


def read_records(files: Sequence[Path], columns: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of ``files`` in order, with only ``columns``."""
    import pyarrow.parquet as pq

    check_columns(files, columns)
    records: list[dict[str, Any]] = []
    for path in files:
        try:
            records.extend(pq.read_table(path, columns=list(columns)).to_pylist())
        except Exception as exc:  # pyarrow raises several error types
            raise SystemExit(f"error: cannot read parquet file {path}: {exc}") from exc
    return records


def report_skipped(split: str, skipped: Sequence[int], total: int, why: str, shown: int = 5) -> None:
    """Warn on stderr about the rows of ``split`` left out, and why."""
    if not skipped:
        return
    indices = ", ".join(str(i) for i in skipped[:shown]) + ("" if len(skipped) <= shown else ", ...")
    print(
        f"warning: split '{split}': skipped {len(skipped)} of {total} row(s) {why} (row indices: {indices})",
        file=sys.stderr,
    )


def make_parser(description: str, dataset: str, agent_name: str, agent_cfg_path: str) -> argparse.ArgumentParser:
    """The arguments every script takes: ``--input_dir``, ``--local_dir``, ``--agent_name``, ``--agent_cfg_path``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--input_dir", required=True, help=f"local {dataset} directory")
    parser.add_argument("--local_dir", required=True, help="output directory (created if missing)")
    parser.add_argument("--agent_name", default=agent_name)
    parser.add_argument("--agent_cfg_path", default=agent_cfg_path)
    return parser


def agent_fields(args: argparse.Namespace) -> dict[str, str]:
    """``agent_name`` and ``agent_cfg_path`` from the parsed arguments."""
    return {"agent_name": args.agent_name, "agent_cfg_path": args.agent_cfg_path}


def task_row(
    *,
    data_source: str,
    agent_name: str,
    agent_cfg_path: str,
    user: str | list[dict[str, Any]],
    ground_truth: str,
    extra_info: dict[str, Any],
    system: str | None = None,
    ability: str | None = None,
) -> dict[str, Any]:
    """One agent-task row: a ``[system,] user`` prompt (the user content a string or a list of content parts), the
    ``ability`` when given, and a rule-style reward."""
    prompt = [{"role": "system", "content": system}] if system is not None else []
    row: dict[str, Any] = {
        "data_source": data_source,
        "agent_name": agent_name,
        "agent_cfg_path": agent_cfg_path,
        "prompt": [*prompt, {"role": "user", "content": user}],
    }
    if ability is not None:
        row["ability"] = ability
    row["reward_model"] = {"style": "rule", "ground_truth": ground_truth}
    row["extra_info"] = extra_info
    return row


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` as JSON lines to ``path`` (creating its folder); returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            written += 1
    return written


def convert_split(
    files: Sequence[Path], split: str, output_path: Path, columns: Sequence[str], to_row: RowFn, why: str
) -> int:
    """Write the rows ``to_row`` makes from the records of ``files``; reports the skipped ones ``why``."""
    records = read_records(files, columns)
    skipped: list[int] = []

    def rows() -> Iterator[dict[str, Any]]:
        for index, record in enumerate(records):
            row = to_row(index, record)
            if row is None:
                skipped.append(index)
            else:
                yield row

    written = write_jsonl(output_path, rows())
    report_skipped(split, skipped, len(records), why)
    return written


def bind_split(make_row: Callable[..., dict[str, Any] | None], **kwargs: Any) -> SplitRowFn:
    """A ``row_fn`` for :func:`prepare_splits` calling ``make_row(index, record, split=split, **kwargs)``."""
    return lambda split, local_dir: partial(make_row, split=split, **kwargs)


def prepare_splits(
    args: argparse.Namespace,
    dataset: str,
    columns: Sequence[str],
    row_fn: SplitRowFn,
    why: str,
    subset: str | None = None,
) -> dict[str, int]:
    """Find and check every split of ``args.input_dir``, then write each to ``args.local_dir/<split>.jsonl`` with
    ``row_fn(split, local_dir)``'s rows; returns ``{split: rows_written}``."""
    input_dir = Path(args.input_dir).expanduser()
    local_dir = Path(args.local_dir).expanduser()
    split_files = {split: find_split_files(input_dir, split, dataset, subset) for split in SPLITS}
    for files in split_files.values():  # validate every split before writing anything
        check_columns(files, columns)
    counts: dict[str, int] = {}
    for split, files in split_files.items():
        output_path = local_dir / f"{split}.jsonl"
        counts[split] = convert_split(files, split, output_path, columns, row_fn(split, local_dir), why)
        print(f"wrote {counts[split]} rows to {output_path}")
    return counts
