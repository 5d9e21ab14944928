"""Data files read row by row: JSON, JSONL or Parquet, each row placed (file, line or row) for the errors that name it."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lit_agentrl.errors import UserInputError

_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_SHOWN_CHARS = 80


@dataclass
class DataFile:
    """A data file's rows and where each one is, as a person counts: JSON lines by their physical line (1-based),
    JSON arrays and Parquet by their row (1-based)."""

    path: str
    rows: list[dict[str, Any]]
    unit: Literal["line", "row"]
    numbers: list[int]

    def where(self, indices: Sequence[int]) -> str:
        """``line 2``, ``row 3 (1-based)``, ``7 lines (1, 2, 3, 4, 5, ...)``."""
        numbers = [self.numbers[i] for i in indices]
        based = " (1-based)" if self.unit == "row" else ""
        if len(numbers) == 1:
            return f"{self.unit} {numbers[0]}{based}"
        listed = ", ".join(map(str, numbers[:5])) + (", ..." if len(numbers) > 5 else "")
        return f"{len(numbers)} {self.unit}s ({listed}){based}"


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a JSON/JSONL/Parquet file; a :class:`UserInputError` names the file, line and problem."""
    return read_data_file(path).rows


def read_data_file(path: str | Path) -> DataFile:
    """The file's rows (read by ``datasets``) and their places in the file.

    JSON is checked here first (UTF-8, then each line or array item): ``datasets`` reports invalid UTF-8 with no
    place, and bad JSON by pyarrow's 0-based row within a block.
    """
    path = _checked_path(Path(path))
    builder = _BUILDERS[path.suffix.lower()]
    unit, numbers = _scan_json(path) if builder == "json" else ("row", [])
    rows = [] if builder == "json" and not numbers else _read_table(path, builder)
    if not rows:
        raise UserInputError(f"data file {str(path)!r} has no rows")
    if len(numbers) != len(rows):  # Parquet, or datasets counted rows otherwise than the scan: number the rows
        unit, numbers = "row", list(range(1, len(rows) + 1))
    return DataFile(str(path), rows, unit, numbers)


def _checked_path(path: Path) -> Path:
    name = str(path)
    expected = "a .jsonl (one JSON object per line), .json (an array of objects) or .parquet file"
    if path.is_dir():
        raise UserInputError(
            f"data file {name!r} is a directory; expected {expected}",
            hint="list the files in data.train_files / data.val_files (a list of paths is accepted)",
        )
    if path.suffix.lower() not in _BUILDERS:
        raise UserInputError(f"data file {name!r}: unsupported extension {path.suffix!r}; expected {expected}")
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to the working directory {str(Path.cwd())!r})"
        raise UserInputError(f"data file {name!r} does not exist{where}")
    if path.stat().st_size == 0:
        raise UserInputError(f"data file {name!r} is empty; expected {expected}")
    return path


def _read_table(path: Path, builder: str) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as cache:  # keep datasets' Arrow cache out of the user's home
        try:
            table = datasets.load_dataset(
                builder, data_files=str(path), split="train", cache_dir=cache, keep_in_memory=True
            )
            return table.to_list()  # pyarrow decodes text here: invalid UTF-8 in Parquet surfaces now
        except Exception as exc:  # datasets wraps JSON/Arrow errors in several types
            cause = exc.__cause__ or exc
            raise UserInputError(
                f"data file {str(path)!r} could not be read as {builder}: {type(cause).__name__}: {cause}"
            ) from exc


def _scan_json(path: Path) -> tuple[Literal["line", "row"], list[int]]:
    """Check that the file is UTF-8 JSON rows; the line of each row (JSON lines) or 1..n (a JSON array)."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid_utf8(path, data, exc) from exc
    if text.lstrip()[:1] == "[":
        return "row", _scan_json_array(path, text)
    return "line", _scan_json_lines(path, text)


def _invalid_utf8(path: Path, data: bytes, exc: UnicodeDecodeError) -> UserInputError:
    line_start = data.rfind(b"\n", 0, exc.start) + 1
    line_end = data.find(b"\n", exc.start)
    line = data[line_start : len(data) if line_end < 0 else line_end].decode("utf-8", errors="replace")
    number = data.count(b"\n", 0, exc.start) + 1
    return UserInputError(
        f"data file {str(path)!r}, line {number}: invalid UTF-8, byte "
        f"0x{data[exc.start]:02x} at byte offset {exc.start} (column {exc.start - line_start + 1}): {_start(line)}",
        hint=f"save the file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path.name} > fixed{path.suffix}",
    )


def _scan_json_lines(path: Path, text: str) -> list[int]:
    numbers = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue  # blank lines hold no row (datasets skips them too)
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _not_json(path, number, line, exc) from exc
        if not isinstance(value, dict):
            raise UserInputError(
                f"data file {str(path)!r}, line {number}: a JSON {json_type(value)}, expected a row object "
                f"{{'agent_name': ..., 'prompt': [...]}}: {_start(line)}"
            )
        numbers.append(number)
    return numbers


def _scan_json_array(path: Path, text: str) -> list[int]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        line = text.split("\n")[exc.lineno - 1]
        raise _not_json(path, exc.lineno, line, exc) from exc
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise UserInputError(
                f"data file {str(path)!r}, row {i + 1} (1-based): a JSON {json_type(row)}, expected a row object "
                f"{{'agent_name': ..., 'prompt': [...]}}: {_start(json.dumps(row))}"
            )
    return list(range(1, len(rows) + 1))


def _not_json(path: Path, number: int, line: str, exc: json.JSONDecodeError) -> UserInputError:
    return UserInputError(
        f"data file {str(path)!r}, line {number}: not valid JSON ({exc.msg}, column {exc.colno}): {_start(line)}",
        hint="a .jsonl file holds one complete JSON object (a row) per line; a .json file, one JSON array of them",
    )


def _start(text: str) -> str:
    """The start of a line, quoted, for an error message."""
    text = text.strip()
    return repr(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "...")


def json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."
