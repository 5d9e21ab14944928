"""Bad data files and rows: one message naming the file, the line as a person counts it, the field, and what is valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import quick_config

from lit_agentrl.data import load_and_validate
from lit_agentrl.errors import UserInputError

GOOD = {"agent_name": "guess_digit", "prompt": [{"role": "user", "content": "guess"}], "secret": 4}


def line(row: dict) -> bytes:
    return json.dumps(row).encode() + b"\n"


def write(path: Path, *lines: bytes) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(UserInputError) as info:
        load_and_validate([str(path)], reward_fn=None)
    return str(info.value)


def test_invalid_utf8_names_file_line_and_byte(tmp_path):
    path = write(tmp_path / "train.jsonl", line(GOOD), b'{"agent_name": "caf\xe9", "prompt": []}\n')
    message = error_of(path)
    offset = len(line(GOOD)) + len(b'{"agent_name": "caf')
    assert f"data file '{path}', line 2: invalid UTF-8, byte 0xe9 at byte offset {offset} (column 20)" in message
    assert '{"agent_name": "caf\ufffd"' in message and "hint: save the file as UTF-8" in message, message


def test_bad_json_line_is_named_as_counted_from_1_and_shown(tmp_path):
    broken = b'{"agent_name": "guess_digit", "prompt": [{"role": "user", "content": "' + b"x" * 100 + b'"}]\n'
    path = write(tmp_path / "train.jsonl", line(GOOD), broken, line(GOOD))
    message = error_of(path)
    column = len(broken.strip()) + 1  # the missing '}' at the end of the line
    assert f"data file '{path}', line 2: not valid JSON (Expecting ',' delimiter, column {column})" in message, message
    assert repr(broken.decode().strip()[:80] + "...") in message and "row 1" not in message


def test_blank_lines_count_toward_the_line_number(tmp_path):
    path = write(tmp_path / "train.jsonl", line(GOOD), b"\n", line({**GOOD, "agent_name": None}))
    assert f"data file '{path}', line 3: field 'agent_name' is missing or empty" in error_of(path)


def test_a_line_that_is_not_an_object_is_refused(tmp_path):
    path = write(tmp_path / "train.jsonl", line(GOOD), b"[1, 2]\n")
    message = error_of(path)
    assert f"data file '{path}', line 2: a JSON array, expected a row object" in message, message


def test_a_directory_is_not_a_data_file(tmp_path):
    folder = tmp_path / "train.jsonl"
    folder.mkdir()
    message = error_of(folder)
    assert f"data file '{folder}' is a directory; expected a .jsonl (one JSON object per line)" in message, message
    assert "does not exist" not in message


def test_empty_prompt_list(tmp_path):
    path = write(tmp_path / "train.jsonl", line(GOOD), line({**GOOD, "prompt": []}))
    message = error_of(path)
    expected = "line 2: field 'prompt' is an empty list; the prompt needs at least one message {'role': 'user'"
    assert f"data file '{path}', {expected}" in message, message
    assert "got list" not in message


@pytest.mark.parametrize(
    "message, state",
    [({"role": "user", "content": None}, "null"), ({"role": "assistant"}, "missing")],
)
def test_null_or_missing_content_is_refused(tmp_path, message, state):
    prompt = [{"role": "user", "content": "guess"}, message]
    path = write(tmp_path / "train.jsonl", line(GOOD), line({**GOOD, "prompt": prompt}))
    text = error_of(path)
    assert f"data file '{path}', line 2: field 'prompt'[1].content is {state} (role {message['role']!r})" in text
    assert "only an assistant message with 'tool_calls' may leave it null" in text, text


def test_an_assistant_turn_that_only_calls_tools_may_have_null_content(tmp_path):
    call = {"type": "function", "function": {"name": "guess", "arguments": "{}"}}
    prompt = [
        {"role": "user", "content": "guess"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "too low"},
    ]
    path = write(tmp_path / "train.jsonl", line({**GOOD, "prompt": prompt}))
    assert load_and_validate([str(path)], reward_fn=None)[0]["prompt"][1]["content"] is None


def test_content_that_is_not_a_string_is_refused(tmp_path):
    path = write(tmp_path / "train.jsonl", line({**GOOD, "prompt": [{"role": "user", "content": 5}]}))
    assert "line 1: field 'prompt'[0].content must be a string or a list of content parts, got number 5" in error_of(
        path
    )


def test_json_array_rows_are_numbered_from_1(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([GOOD, {**GOOD, "prompt": "guess"}], indent=1))
    message = error_of(path)
    assert f"data file '{path}', row 2 (1-based): field 'prompt' must be a list of chat messages" in message, message


def test_json_array_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[\n{"agent_name": "guess_digit"},\n{"agent_name": }\n]\n')
    assert f"data file '{path}', line 3: not valid JSON (Expecting value, column 16)" in error_of(path)


def test_parquet_rows_are_numbered_from_1(tmp_path):
    import pandas as pd

    path = tmp_path / "train.parquet"
    pd.DataFrame([GOOD, {**GOOD, "agent_name": "nobody"}]).to_parquet(path)
    assert f"data file '{path}', row 2 (1-based): field 'agent_name': unknown agent_name 'nobody'" in error_of(path)


def test_errors_across_files_name_each_file(tmp_path):
    first = write(tmp_path / "a.jsonl", line(GOOD), line({**GOOD, "prompt": []}))
    second = write(tmp_path / "b.jsonl", line({**GOOD, "prompt": []}))
    with pytest.raises(UserInputError) as info:
        load_and_validate([str(first), str(second)], reward_fn=None)
    assert f"'{first}', line 2: " in str(info.value) and f"'{second}', line 1: " in str(info.value)


@pytest.mark.slow
def test_fit_reports_bad_data_by_file_and_line(tmp_path, quickstart_model_dir, capsys):
    """End to end through ``lit-agentrl fit``: the message reaches the user (the CLI decides how it is printed)."""
    from lit_agentrl.cli import main

    good = (Path(__file__).parents[2] / "data/quickstart/train.jsonl").read_bytes().splitlines(keepends=True)
    data = write(tmp_path / "bad.jsonl", *good[:4], b'{"agent_name": "single_turn", "prompt": \n', *good[4:8])
    path = quick_config(tmp_path, quickstart_model_dir, steps=1)
    config = yaml.safe_load(path.read_text())
    config["data"]["train_files"] = str(data)
    path.write_text(yaml.safe_dump(config))
    with pytest.raises((UserInputError, SystemExit)) as info:
        main(["fit", "--config", str(path)])
    output = str(info.value) + capsys.readouterr().err
    assert f"data file '{data}', line 5: not valid JSON" in output, output
