"""Hermes/Qwen tool-call parsing: valid, several, malformed, none, and fuzzed input never raises."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from lit_agentrl.agents.tool_parser import parse_tool_calls


def block(payload: str) -> str:
    return f"<tool_call>\n{payload}\n</tool_call>"


def test_no_tool_call_keeps_text_verbatim():
    parsed = parse_tool_calls("  The answer is \\boxed{3}.\n")
    assert parsed.content == "  The answer is \\boxed{3}.\n"
    assert parsed.tool_calls == [] and parsed.invalid_tool_calls == []


def test_one_valid_call_and_surrounding_text():
    text = "Let me check.\n" + block('{"name": "check", "arguments": {"answer": "3"}}')
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me check."
    assert [(c["name"], c["args"]) for c in parsed.tool_calls] == [("check", {"answer": "3"})]
    assert parsed.tool_calls[0]["id"].startswith("call_")


def test_several_calls_in_order_with_unique_ids():
    text = block('{"name": "a", "arguments": {"x": 1}}') + "\n" + block('{"name": "b", "arguments": {}}')
    calls = parse_tool_calls(text).tool_calls
    assert [c["name"] for c in calls] == ["a", "b"]
    assert calls[0]["id"] != calls[1]["id"]


def test_string_encoded_arguments_are_decoded():
    payload = json.dumps({"name": "a", "arguments": json.dumps({"x": 1})})
    assert parse_tool_calls(block(payload)).tool_calls[0]["args"] == {"x": 1}


def test_malformed_calls_become_invalid_tool_calls():
    text = "".join(
        [
            block('{"name": "a", "arguments": {"x": 1'),  # broken JSON
            block('["not", "an", "object"]'),
            block('{"arguments": {}}'),  # no name
            block('{"name": "a", "arguments": [1]}'),  # arguments not an object
        ]
    )
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == []
    errors = [c["error"] for c in parsed.invalid_tool_calls]
    assert len(errors) == 4
    assert (
        "invalid JSON" in errors[0] and "JSON object" in errors[1] and "name" in errors[2] and "arguments" in errors[3]
    )


def test_unterminated_last_call_is_still_parsed():
    parsed = parse_tool_calls('thinking <tool_call>\n{"name": "a", "arguments": {"x": 2}}')
    assert parsed.tool_calls[0]["args"] == {"x": 2}
    assert parsed.content == "thinking"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*'<>/{}[]":,tool_cal \n\\ab1', "<tool_call>", "</tool_call>", '"name"'])))
def test_fuzzed_text_never_raises(pieces: list[str]):
    parsed = parse_tool_calls("".join(pieces))
    for call in parsed.tool_calls:
        assert isinstance(call["name"], str) and isinstance(call["args"], dict)
    for bad in parsed.invalid_tool_calls:
        assert bad["error"]


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
    )
)
def test_fuzzed_json_payloads_never_raise(payload):
    parsed = parse_tool_calls(block(json.dumps(payload)))
    assert len(parsed.tool_calls) + len(parsed.invalid_tool_calls) == 1
