"""Rows checked before the first step: the agent, its YAML, the prompt's messages, the images, the ground truth. Every
problem names its file, line (or row) and field, and what would be valid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lit_agentrl.agents.config import load_agent_cfg
from lit_agentrl.agents.registry import get_agent_class
from lit_agentrl.data.files import DataFile, json_type, read_data_file, short
from lit_agentrl.errors import UserInputError
from lit_agentrl.rewards import resolve_reward_fn
from lit_agentrl.rows import PROMPT_KEYS, row_ground_truth

_MAX_ERRORS_SHOWN = 10
_ROLES = ("system", "user", "assistant", "tool")
_MESSAGE = "{'role': 'user', 'content': '...'}"
_ROW_HINT = "a row needs 'agent_name' and 'prompt' (a list of chat messages); see docs/data.md"


def row_errors(row: Mapping[str, Any], data_dir: Path, reward_fn: str | None) -> list[str]:
    """What is wrong with one row, each naming the field; empty when the row is usable."""
    errors = _agent_errors(row, data_dir)
    errors += _prompt_errors(row)
    errors += _ground_truth_errors(row, reward_fn)
    errors += _image_errors(row)
    return errors


def _scores_itself(row: Mapping[str, Any]) -> bool:
    """Whether the row's agent sets its own reward (an environment), so no reward function applies to the row."""
    try:
        return bool(getattr(get_agent_class(str(row.get("agent_name"))), "scores_itself", False))
    except KeyError:
        return False


def _image_errors(row: Mapping[str, Any]) -> list[str]:
    """Problems with a row's ``images`` (paths, or ``{"bytes"}``/``{"path"}`` dicts as ``data/prepare_geo3k.py``
    writes them): each must exist and decode."""
    images = row.get("images")
    if images is None:
        return []
    if not isinstance(images, list):
        return [f"field 'images' must be a list of images, got {json_type(images)} {short(images)}"]
    from lit_agentrl.models.processors import load_image

    errors = []
    for k, image in enumerate(images):
        if not isinstance(image, (str, dict, bytes)):
            errors.append(
                f"field 'images' item {k}: expected a path or a {{'bytes'|'path'}} object, got {json_type(image)}"
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
        errors.append(f"field 'agent_name' must be a string, got {json_type(agent_name)} {short(agent_name)}")
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
        errors.append(f"field 'agent_cfg_path' must be a path string, got {json_type(cfg_path)} {short(cfg_path)}")
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
    if _scores_itself(row):  # no reward function applies to the row
        return []
    try:
        reward = resolve_reward_fn(row, reward_fn)
    except KeyError as exc:
        return [f"reward: {exc.args[0]}"]
    if reward is None:
        return []
    truth = row_ground_truth(row)
    if truth in (None, "") and getattr(reward, "needs_ground_truth", True):
        return ["field 'reward_model.ground_truth' (or 'ground_truth') is missing; the reward function needs it"]
    check = getattr(reward, "check_ground_truth", None)
    problem = check(truth) if check is not None and truth not in (None, "") else None
    return [f"field 'reward_model.ground_truth' {problem}"] if problem else []


def _prompt_errors(row: Mapping[str, Any]) -> list[str]:
    key = next((k for k in PROMPT_KEYS if k in row), None)
    if key is None:
        return [f"no prompt: expected a field named one of {list(PROMPT_KEYS)}, a list of messages like [{_MESSAGE}]"]
    prompt = row[key]
    if not isinstance(prompt, list):
        return [
            f"field {key!r} must be a list of chat messages like [{_MESSAGE}], got {json_type(prompt)} {short(prompt)}"
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
        return f" must be a message with 'role' and 'content' like {_MESSAGE}, got {short(message)}"
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
        return f".content must be a string or a list of content parts, got {json_type(content)} {short(content)}"
    return None


def _part_problem(part: Any) -> str | None:
    """What is wrong with one content part (a text part, or an image part whose image must load), or None."""
    from lit_agentrl.agents.multimodal import image_source, is_image_part
    from lit_agentrl.models.processors import load_image

    if is_image_part(part):
        try:
            load_image(image_source(part))
        except ValueError as exc:
            return f": {exc}"
        return None
    if isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
        return None
    return f" must be a text part {{'type': 'text', 'text': '...'}} or an image part, got {short(part)}"


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


def load_and_validate(
    paths: Sequence[str], reward_fn: str | None, row_defaults: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Load every file and validate every row; one :class:`UserInputError` lists the first problems found,
    each with its file, line (or row) and field. ``row_defaults``: fields given to every row without them."""
    return [row for file in load_validated_files(paths, reward_fn, row_defaults) for row in file.rows]


def load_validated_files(
    paths: Sequence[str], reward_fn: str | None, row_defaults: Mapping[str, Any] | None = None
) -> list[DataFile]:
    """:func:`load_and_validate`'s files, each row's place in its file kept (for :func:`check_ground_truths`)."""
    files = [read_data_file(path) for path in paths]
    for file in files:
        file.rows[:] = [{**(row_defaults or {}), **row} for row in file.rows]
    problems: _Problems = {}
    for f, file in enumerate(files):
        data_dir = Path(file.path).resolve().parent
        for i, row in enumerate(file.rows):
            for error in row_errors(row, data_dir, reward_fn):
                problems.setdefault((f, error), []).append(i)
            if row.get("agent_cfg_path") and isinstance(row["agent_cfg_path"], str):
                row["agent_cfg_path"] = resolve_cfg_path(row["agent_cfg_path"], data_dir)
    _raise_problems(files, problems, _ROW_HINT)
    return files


def check_ground_truths(files: Sequence[DataFile], reward_fn: str | None, key: str) -> None:
    """Refuse rows that ``reward_fn`` (the default reward, set by ``key``) would score but that carry no usable ground
    truth, naming each file, line and field."""
    problems: _Problems = {}
    for f, file in enumerate(files):
        for i, row in enumerate(file.rows):
            for error in _ground_truth_errors(row, reward_fn):
                problems.setdefault((f, error), []).append(i)
    _raise_problems(files, problems, f"each row scored by {key}={reward_fn!r} needs a ground truth")


_Problems = dict[tuple[int, str], list[int]]
"""(file, error) -> rows, so one mistake repeated is one line."""


def _raise_problems(files: Sequence[DataFile], problems: _Problems, hint: str) -> None:
    if not problems:
        return
    lines = [
        f"data file {files[f].path!r}, {files[f].where(indices)}: {error}" for (f, error), indices in problems.items()
    ]
    shown = "\n  ".join(lines[:_MAX_ERRORS_SHOWN])
    more = f"\n  ... and {len(lines) - _MAX_ERRORS_SHOWN} more" if len(lines) > _MAX_ERRORS_SHOWN else ""
    raise UserInputError(f"invalid data:\n  {shown}{more}", hint=hint)


def prompt_text(message: Mapping[str, Any]) -> str:
    """A message's text, its text parts joined when its content is a list of parts."""
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return " ".join(str(part.get("text")) for part in content if isinstance(part, Mapping) and part.get("text"))
