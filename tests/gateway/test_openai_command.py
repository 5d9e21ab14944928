"""``openai_command``: a separate program per trajectory, in a process group of its own that goes with it (on exit
and on timeout), whose result line is read strictly, run under the trainer's interpreter when it names ``python``."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from gateway_support import ROW, SAMPLING

from lit_agentrl.agents.openai_command import PYTHON_NAMES, command_result, resolved_command
from lit_agentrl.rollout.manager import RolloutManager


def _run(engine, tokenizer, tmp_path: Path, program: str, timeout_s: float | None = 60.0, command=None):
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(program))
    cfg = tmp_path / "command.yaml"
    cfg.write_text(f"command: {command or [sys.executable, str(script)]!r}\n")
    manager = RolloutManager([engine], tokenizer, trajectory_timeout_s=timeout_s)
    try:
        row = {**ROW, "agent_name": "openai_command", "agent_cfg_path": str(cfg)}
        (trajectory,) = manager.generate([row], n_samples=1, sampling_params=SAMPLING).trajectories
    finally:
        manager.close()
    return trajectory


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


CHILD_HOLDING_STDOUT = """
    import json, os, subprocess, sys
    import openai
    json.load(sys.stdin)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # inherits stdout
    open(os.environ["PID_FILE"], "w").write(str(child.pid))
    openai.OpenAI().chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    print(1.0)
"""


def test_a_child_left_holding_stdout_neither_outlives_nor_holds_up_its_trajectory(
    scripted_engine_factory, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setenv("PID_FILE", str(tmp_path / "child.pid"))
    trajectory = _run(scripted_engine_factory(["ok"]), tokenizer, tmp_path, CHILD_HOLDING_STDOUT, timeout_s=120)
    # It finished with the program (far inside its 120 s timeout, which would otherwise have failed it), and the
    # child it left behind was killed with its process group.
    assert not trajectory.failed, trajectory.failure_reason
    assert trajectory.reward == 1.0
    assert not _alive(int((tmp_path / "child.pid").read_text()))


HANGING_WITH_A_CHILD = """
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.environ["PID_FILE"], "w").write(f"{os.getpid()} {child.pid}")
    time.sleep(600)
"""


def test_a_program_past_the_timeout_is_killed_with_its_whole_group(
    scripted_engine_factory, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setenv("PID_FILE", str(tmp_path / "pids"))
    trajectory = _run(scripted_engine_factory([]), tokenizer, tmp_path, HANGING_WITH_A_CHILD, timeout_s=3)
    assert trajectory.failed and trajectory.failure_reason.startswith("timeout")
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        assert not _alive(pid)


def test_a_malformed_result_line_fails_the_trajectory_quoting_it(scripted_engine_factory, tokenizer, tmp_path):
    program = 'import sys, json; json.load(sys.stdin); print("reward: 1")\n'
    trajectory = _run(scripted_engine_factory([]), tokenizer, tmp_path, program)
    assert trajectory.failed and "it printed: 'reward: 1'" in trajectory.failure_reason


@pytest.mark.parametrize(
    ("stdout", "says"),
    [
        ("0.5\n", 0.5),
        ('progress\n{"reward": 1, "metrics": {"turns": 2}}\n', 1.0),
        ("null\n", None),
        ("", None),
        ('{"reward": 1, "score": 2}', "unknown keys ['score']"),
        ('{"reward": "high"}', "could not convert"),
        ('{"final_answer": 5}', "final_answer must be a string"),
        ("[1]", "it printed: '[1]'"),
        ("true", "it printed: 'true'"),
    ],
)
def test_result_lines(stdout, says):
    if isinstance(says, str):
        with pytest.raises(ValueError, match="must be a number, null or a JSON object") as raised:
            command_result(stdout, "agent.py")
        assert says in str(raised.value)
    else:
        result = command_result(stdout)
        assert (result.reward if result is not None else None) == says


def test_a_result_line_names_turn_rewards_by_reply():
    result = command_result('{"reward": 1, "turn_rewards": {"chatcmpl-a": 0.5, "chatcmpl-b/0": -1}}')
    assert result is not None and result.turn_rewards == {"chatcmpl-a": 0.5, "chatcmpl-b/0": -1.0}


ASKS_ONCE = """
    import json, sys
    import openai
    json.load(sys.stdin)
    openai.OpenAI().chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    print(0.25)
"""


def test_python_in_the_command_is_the_trainers_interpreter(scripted_engine_factory, tokenizer, tmp_path, monkeypatch):
    impostor = tmp_path / "bin" / "python"
    impostor.parent.mkdir()
    impostor.write_text("#!/bin/sh\necho 'not the trainer python' >&2\nexit 3\n")
    impostor.chmod(0o755)
    monkeypatch.setenv("PATH", f"{impostor.parent}{os.pathsep}{os.environ['PATH']}")
    assert resolved_command(["python", "x.py"]) == [sys.executable, "x.py"]
    assert all(resolved_command([name])[0] == sys.executable for name in PYTHON_NAMES)
    trajectory = _run(
        scripted_engine_factory(["ok"]), tokenizer, tmp_path, ASKS_ONCE, command=["python", str(tmp_path / "agent.py")]
    )
    assert not trajectory.failed, trajectory.failure_reason
    assert trajectory.reward == 0.25


def test_a_command_that_is_not_a_list_of_strings_is_refused():
    for bad in (None, "python x.py", [], ["python", 3]):
        with pytest.raises(ValueError, match="needs `command:` as a list of strings"):
            resolved_command(bad)
