"""The viewer's Python side: logs and metrics into one payload, the page around it, and `lit-agentrl view`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from trajectory_fakes import INJECTION

from lit_agentrl.viewer import build_payload, render_page
from lit_agentrl.viewer.cli import view_main
from lit_agentrl.viewer.page import PLACEHOLDER


def embedded_payload(page: str) -> dict:
    match = re.search(r'<script id="payload" type="application/json">(.*?)</script>', page, re.S)
    assert match, "no payload element"
    return json.loads(match.group(1))


def test_payload_holds_every_trajectory_and_the_curves(logged_run):
    payload = build_payload(logged_run.parents[2])  # found below the folder given
    assert payload["run"] == str(logged_run) and payload["metrics_file"] == str(logged_run / "metrics.csv")
    trajectories = payload["trajectories"]
    assert len(trajectories) == 3 * 16 + 2 * 16 and payload["bad_lines"] == 0 and payload["dropped"] == 0
    steps = [t["step"] for t in trajectories]
    assert steps == sorted(steps) and [t["split"] for t in trajectories].count("val") == 32
    assert payload["curves"]["reward"] == {"rollout/reward_mean": [[0, 0.25], [1, 0.5], [2, 0.75]]}
    assert payload["curves"]["length"]["rollout/response_length_mean"][-1] == [2, 3.5]
    assert payload["curves"]["accuracy"] == {"val/accuracy": [[2, 0.6]]}


def test_payload_keeps_the_last_line_of_a_trajectory_and_skips_broken_lines(logged_run):
    log = logged_run / "trajectories" / "rank0.jsonl"
    first = json.loads(log.read_text().splitlines()[0])
    with open(log, "a") as f:  # a resumed run logged step 0 again, then was killed mid-line
        f.write(json.dumps({**first, "reward": 9.0}) + "\n" + '{"step": 3, "spl')
    payload = build_payload(logged_run)
    assert len(payload["trajectories"]) == 80 and payload["bad_lines"] == 1
    key = ("split", "step", "rank", "batch", "group", "sample")
    again = [t for t in payload["trajectories"] if all(t[k] == first[k] for k in key)]
    assert [t["reward"] for t in again] == [9.0]


def test_max_trajectories_keeps_the_latest(logged_run):
    payload = build_payload(logged_run, max_trajectories=20)
    assert len(payload["trajectories"]) == 20 and payload["dropped"] == 60
    assert {t["step"] for t in payload["trajectories"]} == {2}


def test_without_metrics_csv_the_curves_come_from_the_samples(logged_run):
    (logged_run / "metrics.csv").unlink()
    curves = build_payload(logged_run)["curves"]
    assert [step for step, _ in curves["reward"]["logged samples: reward mean"]] == [0, 1, 2]


def test_no_log_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="TrajectoryLog"):
        build_payload(tmp_path)
    assert view_main([str(tmp_path)]) == 2
    assert "no trajectories/*.jsonl" in capsys.readouterr().err


def test_page_embeds_model_text_inertly(logged_run):
    payload = build_payload(logged_run)
    payload["trajectories"][0]["reward"] = float("nan")  # JSON has no NaN; the page gets null
    page = render_page(payload)
    assert PLACEHOLDER not in page and "window.__pwned" in page
    assert "<script>window.__pwned" not in page and "</script><img" not in page
    assert page.count("</script>") == 2  # the payload's and the code's: model text closes nothing
    data = embedded_payload(page)
    assert data["trajectories"][0]["reward"] is None
    assert any(t["str_output"] == INJECTION for t in data["trajectories"])


def test_page_requests_nothing_from_outside():
    template = (Path(__file__).resolve().parents[2] / "lit_agentrl" / "viewer" / "page.html").read_text()
    urls = set(re.findall(r"\w+://[^\s\"')]+", template)) - {"http://www.w3.org/2000/svg"}  # a namespace name
    assert not urls
    assert not re.search(r"\b(src|href)=\"(?!data:)", template)
    assert ".innerHTML" not in template and "insertAdjacentHTML" not in template and "document.write" not in template


def test_view_writes_the_page(logged_run, capsys):
    assert view_main([str(logged_run.parents[2])]) == 0
    page = (logged_run.parents[2] / "view.html").read_text()
    assert len(embedded_payload(page)["trajectories"]) == 80
    assert "80 trajectories" in capsys.readouterr().out


def test_view_serves_on_localhost(logged_run, tmp_path):
    out = tmp_path / "page.html"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lit_agentrl.viewer", str(logged_run), "--out", str(out), "--serve", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        url = re.search(r"http://127\.0\.0\.1:\d+/", lines[1])
        assert url, lines
        with urllib.request.urlopen(url.group(0), timeout=30) as response:
            assert response.read().decode() == out.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
