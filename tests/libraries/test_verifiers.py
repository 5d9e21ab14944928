"""verifiers tasksets through lit-agentrl fit: the TextArena taskset verifiers ships (Hangman, multi-turn) and a
single-turn taskset built from verifiers' own constructors over a local file, rolled out by verifiers in its venv
against the trajectory's gateway; every logged trajectory then replayed through verifiers (its replies served back
in order): the same reward.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from support import fit_rows

from lit_agentrl.agents.config import load_agent_cfg
from lit_agentrl.agents.libraries import verifiers
from lit_agentrl.agents.openai_client import AgentResult
from lit_agentrl.data.validation import row_errors

if not verifiers.verifiers_python().exists():
    if os.environ.get("LIT_AGENTRL_REQUIRE_VERIFIERS") == "1":  # CI sets it, after building the venv
        raise RuntimeError(f"verifiers' venv is not at {verifiers.verifiers_python()} (scripts/build_verifiers_env.sh)")
    pytest.skip("verifiers' adapter tests need its venv: scripts/build_verifiers_env.sh", allow_module_level=True)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ANSWERS = "configs/verifiers/answer_taskset.py:AnswerTaskset"
HANGMAN = {"id": "textarena", "game": "Hangman-v0"}


def rows(taskset: dict, cfg: Path, count: int) -> list[dict]:
    """The taskset's first tasks as rows, written by data/prepare_verifiers.py."""
    out = cfg.parent / "rows"
    command = [sys.executable, str(REPO / "data/prepare_verifiers.py"), "--taskset", json.dumps(taskset)]
    command += ["--local_dir", str(out), "--train_size", str(count), "--val_size", "0", "--agent_cfg_path", str(cfg)]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]


def agent_yaml(tmp_path: Path, max_turns: int) -> Path:
    path = tmp_path / "verifiers.yaml"
    path.write_text(f"agent:\n  max_turns: {max_turns}\n")
    return path


class _Scripted(BaseHTTPRequestHandler):
    """Chat completions, streamed as verifiers asks for them: the server's replies in order (or none: it hangs)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        replies: list[str] | None = self.server.replies  # type: ignore[attr-defined]
        if replies is None:
            time.sleep(3600)  # a model that never answers
        text = replies.pop(0)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        base = {"id": "chatcmpl-replay", "object": "chat.completion.chunk", "created": 0, "model": "replay"}
        for choice in ({"delta": {"role": "assistant", "content": text}}, {"delta": {}, "finish_reason": "stop"}):
            chunk = {**base, "choices": [{"index": 0, "finish_reason": None, **choice}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


@contextmanager
def scripted_model(replies: list[str] | None) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.daemon_threads = True
    server.replies = replies  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()


def episode(row: dict, cfg: Path, base_url: str) -> AgentResult:
    client = SimpleNamespace(base_url=base_url, api_key="replay")
    return asyncio.run(verifiers.VerifiersAgent.function(client, row, load_agent_cfg(cfg)))


def assert_scored_as_verifiers_scores(records: list[dict], prepared: list[dict], cfg: Path) -> None:
    """Each of the first records' replies given to verifiers again, in order, for its row's task: the same reward."""
    assert records and not any(r["failed"] for r in records)
    for record in records[:4]:  # each replay is a verifiers process of a few seconds
        row = prepared[record["group"]]  # every row each step, in order
        assert record["prompt"] == row["prompt"]
        replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        with scripted_model(replies) as url:
            assert episode(row, cfg, url).reward == pytest.approx(record["reward"])


def test_a_single_turn_taskset_of_verifiers_constructors_trains_scored_as_verifiers_scores(tmp_path, tiny_model_dir):
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1 = ?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    cfg = agent_yaml(tmp_path, max_turns=1)
    taskset = {"id": ANSWERS, "path": str(data)}
    prepared = rows(taskset, cfg, 3)
    assert [r["prompt"][-1]["content"] for r in prepared] == ["0 + 1 = ?", "1 + 1 = ?", "2 + 1 = ?"]
    metrics, records = fit_rows(tmp_path / "run", tiny_model_dir, prepared, max_new_tokens=4)
    assert {len([m for m in r["messages"] if m["role"] == "assistant"]) for r in records} == {1}
    assert any(key.endswith("agent/verifiers/exact_answer") for row in metrics for key in row)  # the rubric's own
    assert_scored_as_verifiers_scores(records, prepared, cfg)


def test_verifiers_scores_the_replies_a_scripted_model_gives():
    """The replay the tests rely on: verifiers scores what the scripted model says (1 for the answer, 0 otherwise)."""
    cfg = REPO / "configs/agents/verifiers.yaml"
    data = REPO / "tests/libraries/verifiers_questions.jsonl"
    row = {"taskset": {"id": ANSWERS, "path": str(data)}, "task_index": 0}
    with scripted_model(["<answer>4</answer>"]) as url:
        assert episode(row, cfg, url).reward == 1.0
    with scripted_model(["5"]) as url:
        assert episode(row, cfg, url).reward == 0.0


def test_textarena_hangman_as_verifiers_ships_it_trains_turn_by_turn_scored_as_verifiers_scores(
    tmp_path, tiny_model_dir
):
    cfg = agent_yaml(tmp_path, max_turns=3)
    prepared = rows(HANGMAN, cfg, 2)
    assert "You are playing Hangman" in prepared[0]["prompt"][-1]["content"]
    _, records = fit_rows(tmp_path / "run", tiny_model_dir, prepared, max_new_tokens=6)
    assert max(len([m for m in r["messages"] if m["role"] == "assistant"]) for r in records) >= 2
    assert all(r["messages"][2]["role"] == "assistant" for r in records)  # verifiers' own system prompt, then its task
    assert_scored_as_verifiers_scores(records, prepared, cfg)


def test_rows_are_checked_at_setup_by_loading_their_taskset_in_verifiers(tmp_path):
    cfg = str(agent_yaml(tmp_path, max_turns=1))
    good = {"agent_name": "verifiers", "agent_cfg_path": cfg, "prompt": [{"role": "user", "content": "x"}]}
    assert row_errors({**good, "taskset": HANGMAN, "task_index": 0}, tmp_path, None) == []
    assert "task_index" in " ".join(row_errors({**good, "taskset": HANGMAN, "task_index": -1}, tmp_path, None))
    assert "'taskset' must be a mapping" in " ".join(
        row_errors({**good, "taskset": "x", "task_index": 0}, tmp_path, None)
    )
    unknown = row_errors({**good, "taskset": {"id": "no_such_taskset"}, "task_index": 0}, tmp_path, None)
    assert "verifiers could not load the taskset" in " ".join(unknown) and "no_such_taskset" in " ".join(unknown)


def test_a_missing_venv_is_refused_at_setup_naming_the_build_script(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_AGENTRL_VERIFIERS_PYTHON", str(tmp_path / "nowhere/python"))
    verifiers._taskset_problem.cache_clear()
    row = {"agent_name": "verifiers", "prompt": [{"role": "user", "content": "x"}], "taskset": HANGMAN, "task_index": 0}
    try:
        assert "scripts/build_verifiers_env.sh" in " ".join(row_errors(row, tmp_path, None))
    finally:
        verifiers._taskset_problem.cache_clear()


def harness_processes() -> list[int]:
    """Running processes of verifiers' harness scripts (its uv scripts under ~/.cache/verifiers)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if any("verifiers/runtimes/scripts" in part for part in process.info["cmdline"] or []):
            found.append(process.info["pid"])
    return found


def test_a_rollout_cancelled_by_its_timeout_stops_verifiers_harness_too(tmp_path):
    """A hung model call: the trajectory's timeout cancels the episode, which stops the harness verifiers started in a
    process group of its own (SIGTERM first), so nothing of it keeps running."""
    cfg = REPO / "configs/agents/verifiers.yaml"
    row = {"taskset": {"id": ANSWERS, "path": str(REPO / "tests/libraries/verifiers_questions.jsonl")}, "task_index": 0}
    before = set(harness_processes())

    async def cut_short(url: str) -> None:
        client = SimpleNamespace(base_url=url, api_key="hung")
        work = verifiers.VerifiersAgent.function(client, row, load_agent_cfg(cfg))
        task = asyncio.ensure_future(work)
        deadline = time.monotonic() + 120
        while not set(harness_processes()) - before:  # wait until the harness is waiting on the model
            assert time.monotonic() < deadline and not task.done(), "the harness never started"
            await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with scripted_model(None) as url:
        asyncio.run(cut_short(url))
    time.sleep(1.0)
    left = set(harness_processes()) - before
    assert left == set(), [psutil.Process(pid).cmdline() for pid in left]
