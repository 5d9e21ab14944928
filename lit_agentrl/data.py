"""AgentPromptDataModule: agent-tagged prompt rows, validated up front, split across ranks, resumable.

A row (JSON, JSONL or Parquet) carries the chat prompt, the routing key ``agent_name``, optionally the
agent's YAML ``agent_cfg_path``, the ground truth (``reward_model.ground_truth`` or ``ground_truth``) and
any extra fields, which reach the agent's ``run(**kwargs)``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_agentrl.agents.config import load_agent_cfg
from lit_agentrl.agents.registry import get_agent_class, import_agent_modules
from lit_agentrl.errors import UserInputError
from lit_agentrl.rewards import get_reward_fn, resolve_reward_fn
from lit_agentrl.rows import PROMPT_KEYS, row_ground_truth, row_prompt
from lit_agentrl.types import PromptBatch

_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_MAX_ERRORS_SHOWN = 10
_SHOWN_CHARS = 80
_ROLES = ("system", "user", "assistant", "tool")
_MESSAGE = "{'role': 'user', 'content': '...'}"
_ROW_HINT = "a row needs 'agent_name' and 'prompt' (a list of chat messages); see docs/data.md"


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
                f"data file {str(path)!r}, line {number}: a JSON {_json_type(value)}, expected a row object "
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
                f"data file {str(path)!r}, row {i + 1} (1-based): a JSON {_json_type(row)}, expected a row object "
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


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def row_errors(row: Mapping[str, Any], data_dir: Path, reward_fn: str | None) -> list[str]:
    """What is wrong with one row, each naming the field; empty when the row is usable."""
    errors = _agent_errors(row, data_dir)
    errors += _prompt_errors(row)
    errors += _ground_truth_errors(row, reward_fn)
    errors += _image_errors(row)
    return errors


def _image_errors(row: Mapping[str, Any]) -> list[str]:
    """Problems with a row's ``images`` (paths, or ``{"bytes"}``/``{"path"}`` dicts as ``data/prepare_geo3k.py``
    writes them): each must exist and decode."""
    images = row.get("images")
    if images is None:
        return []
    if not isinstance(images, list):
        return [f"field 'images' must be a list of images, got {_json_type(images)} {_short(images)}"]
    from lit_agentrl.processors import load_image

    errors = []
    for k, image in enumerate(images):
        if not isinstance(image, (str, dict, bytes)):
            errors.append(
                f"field 'images' item {k}: expected a path or a {{'bytes'|'path'}} object, got {_json_type(image)}"
            )
            continue
        try:
            load_image(image)
        except ValueError as exc:
            errors.append(f"field 'images' item {k}: {exc}")
    return errors


def _agent_errors(row: Mapping[str, Any], data_dir: Path) -> list[str]:
    errors = []
    agent_name = row.get("agent_name")
    if not agent_name:
        errors.append("field 'agent_name' is missing or empty; it names a registered agent")
    elif not isinstance(agent_name, str):
        errors.append(f"field 'agent_name' must be a string, got {_json_type(agent_name)} {_short(agent_name)}")
    else:
        try:
            agent_class = get_agent_class(agent_name)
        except KeyError as exc:
            errors.append(f"field 'agent_name': {exc.args[0]}")
        else:  # the fields the agent declares it needs, then its own checks of them (AgentGraph.row_errors)
            errors += [
                f"field {name!r} is missing or null; agent {agent_name!r} needs it (its required_fields)"
                for name in getattr(agent_class, "required_fields", ())
                if row.get(name) is None
            ]
            errors += getattr(agent_class, "row_errors", lambda row: [])(row)
    cfg_path = row.get("agent_cfg_path")
    if cfg_path and not isinstance(cfg_path, str):
        errors.append(f"field 'agent_cfg_path' must be a path string, got {_json_type(cfg_path)} {_short(cfg_path)}")
    elif cfg_path:
        try:
            load_agent_cfg(resolve_cfg_path(cfg_path, data_dir))
        except FileNotFoundError:
            errors.append(
                f"field 'agent_cfg_path': {cfg_path!r} not found from the working directory {str(Path.cwd())!r} "
                f"nor from {str(data_dir)!r} or any folder above it"
            )
        except ValueError as exc:
            errors.append(f"field 'agent_cfg_path': {exc}")
    return errors


def _ground_truth_errors(row: Mapping[str, Any], reward_fn: str | None) -> list[str]:
    try:
        reward = resolve_reward_fn(row, reward_fn)
    except KeyError as exc:
        return [f"reward: {exc.args[0]}"]
    if reward is None:
        return []
    truth = row_ground_truth(row)
    if truth in (None, ""):
        return ["field 'reward_model.ground_truth' (or 'ground_truth') is missing; the reward function needs it"]
    check = getattr(reward, "check_ground_truth", None)
    problem = check(truth) if check is not None else None
    return [f"field 'reward_model.ground_truth' {problem}"] if problem else []


def _prompt_errors(row: Mapping[str, Any]) -> list[str]:
    key = next((k for k in PROMPT_KEYS if k in row), None)
    if key is None:
        return [f"no prompt: expected a field named one of {list(PROMPT_KEYS)}, a list of messages like [{_MESSAGE}]"]
    prompt = row[key]
    if not isinstance(prompt, list):
        return [
            f"field {key!r} must be a list of chat messages like [{_MESSAGE}], got {_json_type(prompt)} {_short(prompt)}"
        ]
    if not prompt:
        return [f"field {key!r} is an empty list; the prompt needs at least one message {_MESSAGE}"]
    for i, message in enumerate(prompt):
        problem = _message_problem(message)
        if problem:
            return [f"field {key!r}[{i}]{problem}"]
    return []


def _message_problem(message: Any) -> str | None:
    """What is wrong with one prompt message (text following the field's name), or None.

    ``content`` must be a string, or a list of content parts (text parts and image parts, as vision-language rows
    carry them: :mod:`lit_agentrl.agents.multimodal`); a null would fail mid-rollout or render as "None". The one
    exception is OpenAI's layout of an assistant turn that only calls tools (null content, non-empty
    ``tool_calls``), which templates render.
    """
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        return f" must be a message with 'role' and 'content' like {_MESSAGE}, got {_short(message)}"
    role, content = message["role"], message.get("content")
    if role not in _ROLES:
        return f": role {role!r} is not one of {', '.join(_ROLES)}"
    if content is None and not (role == "assistant" and message.get("tool_calls")):
        state = "missing" if "content" not in message else "null"
        return (
            f".content is {state} (role {role!r}); it must be a string ('' for an empty turn); "
            "only an assistant message with 'tool_calls' may leave it null"
        )
    if isinstance(content, list):
        return next((f".content[{k}]{p}" for k, part in enumerate(content) if (p := _part_problem(part))), None)
    if content is not None and not isinstance(content, str):
        return f".content must be a string or a list of content parts, got {_json_type(content)} {_short(content)}"
    return None


def _part_problem(part: Any) -> str | None:
    """What is wrong with one content part (a text part, or an image part whose image must load), or None."""
    from lit_agentrl.agents.multimodal import image_source, is_image_part
    from lit_agentrl.processors import load_image

    if is_image_part(part):
        try:
            load_image(image_source(part))
        except ValueError as exc:
            return f": {exc}"
        return None
    if isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
        return None
    return f" must be a text part {{'type': 'text', 'text': '...'}} or an image part, got {_short(part)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def resolve_cfg_path(cfg_path: str, data_dir: Path) -> str:
    """A relative ``agent_cfg_path`` is looked up from the working directory, then from the data file's
    folder and each folder above it (so rows written relative to a project root work from anywhere)."""
    path = Path(cfg_path)
    if path.is_absolute() or path.exists():
        return str(path.resolve())
    for folder in (data_dir, *data_dir.parents):
        if (folder / path).exists():
            return str((folder / path).resolve())
    return str(path)


def load_and_validate(paths: Sequence[str], reward_fn: str | None) -> list[dict[str, Any]]:
    """Load every file and validate every row; one :class:`UserInputError` lists the first problems found,
    each with its file, line (or row) and field."""
    files = [read_data_file(path) for path in paths]
    problems: dict[tuple[int, str], list[int]] = {}  # (file, error) -> rows, so one mistake repeated is one line
    for f, file in enumerate(files):
        data_dir = Path(file.path).resolve().parent
        for i, row in enumerate(file.rows):
            for error in row_errors(row, data_dir, reward_fn):
                problems.setdefault((f, error), []).append(i)
            if row.get("agent_cfg_path") and isinstance(row["agent_cfg_path"], str):
                row["agent_cfg_path"] = resolve_cfg_path(row["agent_cfg_path"], data_dir)
    if problems:
        lines = [
            f"data file {files[f].path!r}, {files[f].where(indices)}: {error}"
            for (f, error), indices in problems.items()
        ]
        shown = "\n  ".join(lines[:_MAX_ERRORS_SHOWN])
        more = f"\n  ... and {len(lines) - _MAX_ERRORS_SHOWN} more" if len(lines) > _MAX_ERRORS_SHOWN else ""
        raise UserInputError(f"invalid data:\n  {shown}{more}", hint=_ROW_HINT)
    return [row for file in files for row in file.rows]


def _prompt_text(message: Mapping[str, Any]) -> str:
    """A message's text, its text parts joined when its content is a list of parts."""
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return " ".join(str(part.get("text")) for part in content if isinstance(part, Mapping) and part.get("text"))


EXTRA_STREAM = 1_000_003
"""Offset of the extra stream's shuffle seeds (dynamic sampling) from the steps' own."""


class PromptBatchLoader:
    """Yields this rank's share of each step's prompts: a seeded shuffle per epoch, resumable mid-epoch.

    Every rank draws the same permutation and takes its slice of each global batch, so ranks never
    overlap. Lightning saves ``state_dict()`` in checkpoints (the loader is ``_Stateful``); the position
    advances only when a batch is consumed (:meth:`mark_consumed`), not when it is prefetched. Training drops
    an epoch's last partial batch (every step has the same size); with ``whole_epoch`` (validation) the last
    batch holds the remaining rows, split across the ranks as evenly as they go, so every row is seen.
    """

    def __init__(
        self,
        rows: list[dict[str, Any]],
        prompts_per_step: int,
        seed: int,
        shuffle: bool,
        rank: int,
        world_size: int,
        split: str,
        whole_epoch: bool = False,
    ) -> None:
        self.rows, self.prompts_per_step, self.seed, self.shuffle = rows, prompts_per_step, seed, shuffle
        self.rank, self.world_size, self.split, self.whole_epoch = rank, world_size, split, whole_epoch
        self.epoch, self.consumed = 0, 0
        self.extra_drawn = 0  # rows drawn so far from the extra stream (dynamic sampling), over all ranks

    def __len__(self) -> int:
        whole, remainder = divmod(len(self.rows), self.prompts_per_step)
        return whole + int(self.whole_epoch and remainder > 0)

    def __iter__(self) -> Iterator[PromptBatch]:
        if self.consumed >= len(self):
            self.epoch, self.consumed = self.epoch + 1, 0
        order = self._order(self.epoch)
        for index in range(self.consumed, len(self)):
            start, end = self._rank_slice(index)
            rows = [self.rows[i] for i in order[start:end]]
            yield PromptBatch(rows=rows, epoch=self.epoch, index=index, split=self.split)

    def _rank_slice(self, index: int) -> tuple[int, int]:
        """This rank's positions in the epoch's order for batch ``index`` (the last one may be partial)."""
        first = index * self.prompts_per_step
        size = min(self.prompts_per_step, len(self.rows) - first)
        per_rank, extra = divmod(size, self.world_size)
        start = first + self.rank * per_rank + min(self.rank, extra)
        return start, start + per_rank + int(self.rank < extra)

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.rows)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.rows), generator=generator).tolist()

    def batch_after(self, batch: PromptBatch, ahead: int) -> PromptBatch:
        """The batch iteration yields ``ahead`` batches after ``batch`` (into later epochs as needed), without
        moving the position: rollouts generated ahead of their step (``mode: async``) are for the batches Lightning
        will fetch, and a resumed run regenerates those it lost."""
        position = batch.index + ahead
        return self.batch_at(batch.epoch + position // len(self), position % len(self))

    def batch_at(self, epoch: int, index: int) -> PromptBatch:
        """This rank's batch ``index`` of ``epoch``, without moving the position."""
        start, end = self._rank_slice(index)
        rows = [self.rows[i] for i in self._order(epoch)[start:end]]
        return PromptBatch(rows=rows, epoch=epoch, index=index, split=self.split)

    def mark_consumed(self, batch: PromptBatch) -> None:
        self.epoch, self.consumed = batch.epoch, batch.index + 1

    def draw_extra(self) -> list[dict[str, Any]]:
        """This rank's share of one more step's worth of prompts, for dynamic sampling.

        They come from a stream of their own (seeded shuffles of the rows, one after another), not from the steps'
        stream, which Lightning has already prefetched from; its position is part of :meth:`state_dict`, so a
        resumed run draws the same extra prompts as an unbroken one.
        """
        per_rank = self.prompts_per_step // self.world_size
        first = self.extra_drawn + self.rank * per_rank
        positions = range(first, first + per_rank)
        self.extra_drawn += self.prompts_per_step
        n = len(self.rows)
        return [self.rows[self._order(EXTRA_STREAM + p // n)[p % n]] for p in positions]

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "extra_drawn": self.extra_drawn,
            "seed": self.seed,
            "num_rows": len(self.rows),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("num_rows", len(self.rows)) != len(self.rows) or state.get("seed", self.seed) != self.seed:
            raise UserInputError(
                f"cannot resume the data position: the checkpoint was taken with {state.get('num_rows')} rows and seed "
                f"{state.get('seed')}, this run has {len(self.rows)} rows and seed {self.seed}"
            )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        self.extra_drawn = int(state.get("extra_drawn", 0))


class AgentPromptDataModule(L.LightningDataModule):
    """Agent-tagged prompt rows for GRPO, validated before the first step.

    Args:
        train_files: JSON/JSONL/Parquet file(s) of training rows.
        val_files: file(s) of validation rows (optional).
        prompts_per_step: prompts per optimizer step across all ranks (each rank gets an equal share).
        val_prompts_per_step: prompts per validation batch across all ranks (default: ``prompts_per_step``).
        seed: seed of the per-epoch shuffle.
        shuffle: shuffle the training rows each epoch.
        reward_fn: default reward function name (rows whose ``data_source`` names none use it); rows that
            get a reward function must carry a ground truth.
        agent_modules: modules (dotted names or ``.py`` paths) to import before validation, so users'
            ``@register`` agents exist.
        max_prompt_length: longest prompt, in tokens of the chat-templated prompt (without the agent's tool
            schemas); None: no limit.
        overlong_prompts: ``error`` refuses the data at setup, ``skip`` drops such rows and reports the count.
        tokenizer_path: the tokenizer that measures prompts (the CLI links it to ``model.model_path``).
        dynamic_sampling: DAPO's dynamic sampling: groups whose rewards are all equal (no gradient) are dropped,
            and more prompts are drawn (one step's worth per round, from a stream of their own) until the step has
            ``prompts_per_step`` informative groups or ``dynamic_max_rounds`` extra rounds are spent.
        dynamic_max_rounds: the most extra rounds of one step.

    Example (YAML, under ``data:``)::

        train_files: data/samples/math_sample_train.jsonl
        prompts_per_step: 8
        reward_fn: math
    """

    def __init__(
        self,
        train_files: str | list[str],
        val_files: str | list[str] | None = None,
        prompts_per_step: int = 8,
        val_prompts_per_step: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        reward_fn: str | None = None,
        agent_modules: list[str] | None = None,
        max_prompt_length: int | None = None,
        overlong_prompts: Literal["error", "skip"] = "error",
        tokenizer_path: str | None = None,
        dynamic_sampling: bool = False,
        dynamic_max_rounds: int = 4,
    ) -> None:
        super().__init__()
        if dynamic_max_rounds < 1:
            raise UserInputError(f"data.dynamic_max_rounds must be >= 1, got {dynamic_max_rounds}")
        self.dynamic_sampling, self.dynamic_max_rounds = dynamic_sampling, dynamic_max_rounds
        if prompts_per_step < 1:
            raise UserInputError(f"data.prompts_per_step must be >= 1, got {prompts_per_step}")
        if reward_fn is not None:
            get_reward_fn(reward_fn)  # unknown names fail here, listing the registered ones
        self.train_files = [train_files] if isinstance(train_files, str) else list(train_files)
        self.val_files = [val_files] if isinstance(val_files, str) else list(val_files or [])
        self.prompts_per_step = prompts_per_step
        self.val_prompts_per_step = val_prompts_per_step or prompts_per_step
        self.seed, self.shuffle, self.reward_fn = seed, shuffle, reward_fn
        self.agent_modules = list(agent_modules or [])
        if overlong_prompts not in ("error", "skip"):
            raise UserInputError(f"data.overlong_prompts must be 'error' or 'skip', got {overlong_prompts!r}")
        if max_prompt_length is not None and max_prompt_length < 1:
            raise UserInputError(f"data.max_prompt_length must be >= 1 or null, got {max_prompt_length}")
        self.max_prompt_length = max_prompt_length
        self.overlong_prompts = overlong_prompts
        self.tokenizer_path = tokenizer_path
        self.num_skipped_overlong = 0
        self._train_loader: PromptBatchLoader | None = None
        self._val_loader: PromptBatchLoader | None = None

    def setup(self, stage: str) -> None:
        import_agent_modules(self.agent_modules)
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        for name, size in (
            ("data.prompts_per_step", self.prompts_per_step),
            ("data.val_prompts_per_step", self.val_prompts_per_step),
        ):
            if size % world:
                raise UserInputError(f"{name}={size} must be divisible by the number of processes ({world})")
        if stage == "fit" and self._train_loader is None:
            rows = self._limit_prompt_length(load_and_validate(self.train_files, self.reward_fn), self.train_files)
            if len(rows) < self.prompts_per_step:
                raise UserInputError(
                    f"{self.train_files}: {len(rows)} rows, fewer than data.prompts_per_step={self.prompts_per_step}"
                )
            self._train_loader = PromptBatchLoader(
                rows, self.prompts_per_step, self.seed, self.shuffle, rank, world, "train"
            )
        if self.val_files and self._val_loader is None and stage in ("fit", "validate"):
            rows = self._limit_prompt_length(load_and_validate(self.val_files, self.reward_fn), self.val_files)
            self._val_loader = PromptBatchLoader(
                rows, self.val_prompts_per_step, self.seed, False, rank, world, "val", whole_epoch=True
            )

    def _limit_prompt_length(self, rows: list[dict[str, Any]], files: list[str]) -> list[dict[str, Any]]:
        """Refuse or drop rows whose prompt exceeds ``max_prompt_length`` tokens (images counted as the tokens they
        widen to: :mod:`lit_agentrl.prompt_tokens`)."""
        if self.max_prompt_length is None:
            return rows
        if not self.tokenizer_path:
            raise UserInputError(
                "data.max_prompt_length needs data.tokenizer_path (the CLI links it to model.model_path)"
            )
        from lit_agentrl.prompt_tokens import PromptMeasure

        measure = PromptMeasure(self.tokenizer_path)
        try:
            over = [i for i, row in enumerate(rows) if measure(row) > self.max_prompt_length]
        except ValueError as exc:
            raise UserInputError(f"{files}: {exc}") from exc
        if not over:
            return rows
        example = _short(_prompt_text(row_prompt(rows[over[0]])[-1]))
        what = f"{files}: {len(over)} of {len(rows)} prompts are longer than data.max_prompt_length={self.max_prompt_length} tokens (e.g. {example})"
        if self.overlong_prompts == "error":
            raise UserInputError(what, hint="raise data.max_prompt_length or set data.overlong_prompts: skip")
        rank_zero_info(f"AgentPromptDataModule: skipping them. {what}")
        self.num_skipped_overlong += len(over)
        dropped = set(over)
        return [row for i, row in enumerate(rows) if i not in dropped]

    def train_dataloader(self) -> PromptBatchLoader:
        assert self._train_loader is not None, "setup('fit') must run first"
        return self._train_loader

    def draw_extra_train_rows(self) -> list[dict[str, Any]]:
        """This rank's share of one more step's worth of training prompts (dynamic sampling)."""
        assert self._train_loader is not None, "setup('fit') must run first"
        return self._train_loader.draw_extra()

    def val_dataloader(self) -> PromptBatchLoader | list:
        if self._val_loader is None:
            return []
        self._val_loader.consumed = 0  # validation always runs the whole set
        return self._val_loader

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, PromptBatch) and batch.split == "train" and self._train_loader is not None:
            self._train_loader.mark_consumed(batch)
        return batch
