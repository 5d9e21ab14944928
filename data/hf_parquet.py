"""Reading a local copy of a Hugging Face dataset's parquet files, split by split (for the ``prepare_*`` scripts).

A file belongs to a split when its stem is the split (``train.parquet``), starts with ``<split>-``
(``data/train-00000-of-00001.parquet``) or when it sits in a folder named after the split (``train/0.parquet``).
Sharded splits are concatenated in file-name order.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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
