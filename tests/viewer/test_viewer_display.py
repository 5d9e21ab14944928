"""Tool output shown inert: control characters, terminal escapes and bidi overrides become visible escapes in every
place that shows a trajectory (the JSON log, the CSV logger's samples page, the logger's table, the viewer), while
the trajectory itself, and so what the model was given, keeps every character."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from lit_agentrl.display import INERT_CHARACTERS, inert, inert_values, json_inert
from lit_agentrl.rollout.failure_report import FailureReport, first_tracebacks
from lit_agentrl.types import Trajectory
from lit_agentrl.viewer import build_payload, render_page
from lit_agentrl.viewer.records import samples_text, table_row, to_json_line, trajectory_record
from lit_agentrl.viewer.writer import append_jsonl

HOSTILE = {
    "nul": "a\x00b",
    "clipboard (OSC 52)": "\x1b]52;c;cm0gLXJmIH4=\x07",
    "hyperlink (OSC 8)": "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "window title": "\x1b]0;owned\x07",
    "screen clear": "\x1b[2J\x1b[H",
    "CSI colour": "\x1b[31mred\x1b[0m",
    "8-bit CSI": "\x9b2J",
    "carriage return": "ok\rFAIL",
    "backspace and DEL": "x\x08\x7f",
    "bidi override": "abc\u202egnp.exe",
    "bidi isolate": "\u2066x\u2069\u2067y\u2069\u2068z\u2069",
    "bidi embedding and marks": "\u202a\u202b\u202c\u202d\u200e\u200f\u061c",
}
TEXT = "\n".join(f"{name}: {value}" for name, value in HOSTILE.items()) + "\ttab"


def raw(text: str) -> set[str]:
    return set(text) & INERT_CHARACTERS


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_inert_escapes_each_class_and_keeps_newlines_and_tabs(name):
    shown = inert(f"{HOSTILE[name]}\n\t")
    assert not raw(shown) and shown.endswith("\n\t")
    assert inert("plain text, ünïcödé and 数学 stay") == "plain text, ünïcödé and 数学 stay"


def test_the_escapes_are_readable():
    assert inert("\x1b[2J\x00\u202e") == "\\x1b[2J\\x00\\u202e"
    assert inert_values({"a\x1b": ["\x07", 1, None, ("\u2066",)]}) == {"a\\x1b": ["\\x07", 1, None, ["\\u2066"]]}


def test_json_inert_is_lossless():
    text = json_inert(json.dumps({"out": TEXT}, ensure_ascii=False))
    assert not raw(text) and json.loads(text) == {"out": TEXT}


def tool_trajectory() -> Trajectory:
    return Trajectory(
        group=0,
        sample=0,
        agent_name="mathcode_agent",
        reward=1.0,
        str_output=TEXT,
        messages=[{"role": "user", "content": "run it"}, {"role": "tool", "content": TEXT, "tool_call_id": "c0"}],
        failed=True,
        failure_reason="ValueError: " + TEXT,
        failure_traceback="Traceback:\n" + TEXT,
    )


def record() -> dict:
    return trajectory_record(tool_trajectory(), {"prompt": TEXT}, step=0, split="train", rank=0, batch=0, tokens=False)


def test_the_trajectory_keeps_the_tool_text_exactly():
    assert record()["messages"][1]["content"] == TEXT and record()["str_output"] == TEXT


def test_the_json_log_line_parses_back_to_the_exact_text():
    line = to_json_line(record(), None)
    assert not raw(line) and json.loads(line)["messages"][1]["content"] == TEXT


def test_the_samples_page_and_the_logger_table_are_inert():
    page = samples_text([record()])
    assert not raw(page) and "\\x1b]52;c;" in page and "\\u202e" in page
    row = table_row(record())
    assert not any(raw(cell) for cell in row if isinstance(cell, str)) and "\\x1b[2J" in row[4]


def test_the_viewer_shows_escapes(tmp_path):
    append_jsonl(tmp_path / "trajectories" / "rank0.jsonl", [record()], None)
    payload = build_payload(tmp_path)
    (shown,) = payload["trajectories"]
    assert shown["messages"][1]["content"] == inert(TEXT) and not raw(json.dumps(payload, ensure_ascii=False))
    assert not raw(render_page(payload))


def test_the_consoles_failure_warning_is_inert():
    failed = tool_trajectory()
    report = FailureReport().message(0, 1, 1, Counter([failed.failure_reason]), first_tracebacks([failed]))
    assert not raw(report) and "\\x1b]0;owned\\x07" in report and report.count("\n") > TEXT.count("\n")
