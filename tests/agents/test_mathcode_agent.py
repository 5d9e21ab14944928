"""mathcode_agent: the model's code runs in the sandbox, its output goes back token-exact, the answer is scored."""

from __future__ import annotations

import asyncio

import pytest
from support import REPO_ROOT, tool_call_text, without_bubblewrap
from test_token_exact_trajectories import RecordingScripted, assert_token_invariants

from lit_agentrl.agents import load_agent_cfg
from lit_agentrl.agents.mathcode import MathCodeAgentGraph
from lit_agentrl.agents.registry import get_agent_class
from lit_agentrl.errors import UserInputError
from lit_agentrl.rewards import get_reward_fn
from lit_agentrl.rows import agent_run_kwargs
from lit_agentrl.tools.sandbox import SandboxResult

MATH_CODE_CFG = REPO_ROOT / "configs" / "agents" / "math_code.yaml"
SAMPLING = {"max_new_tokens": 256, "temperature": 1.0}
ROW = {"prompt": [{"role": "user", "content": "What is 6 times 7?"}], "ground_truth": "42"}


def run_agent(engine, tokenizer, cfg_path=MATH_CODE_CFG, **kwargs):
    graph = MathCodeAgentGraph("mathcode_agent", load_agent_cfg(cfg_path), engine, tokenizer, **kwargs)
    graph.check_template_drift = True
    return asyncio.run(graph.run(sampling_params=SAMPLING, **agent_run_kwargs(ROW)))


def fast_cfg(tmp_path):
    path = tmp_path / "math_code_fast.yaml"
    path.write_text("max_ai_message_turn: 4\nsandbox:\n  cpu_seconds: 1\n  wall_seconds: 3\n")
    return path


def test_registered():
    assert get_agent_class("mathcode_agent") is MathCodeAgentGraph


@pytest.mark.usefixtures("sandbox_boundary")
def test_code_runs_and_the_boxed_answer_scores(scripted_engine_factory, tokenizer):
    engine = RecordingScripted(
        scripted_engine_factory(
            [
                "Let me compute it.\n" + tool_call_text("execute_python", {"code": "print(6*7)"}),
                "The code printed 42, so the answer is \\boxed{42}.",
            ]
        )
    )
    output = run_agent(engine, tokenizer)
    assert_token_invariants(output, engine)
    assert output.extra_fields["num_model_turns"] == 2 and output.extra_fields["num_tool_calls"] == 1
    assert output.extra_fields["num_tool_errors"] == 0 and output.extra_fields["template_drift"] == 0
    # The tool's answer (what the code printed) is in the trajectory, as a tool turn (loss_mask 0).
    assert "<tool_response>\n42\n</tool_response>" in output.str_output
    assert output.reward_score is None  # the `math` reward scores the boxed answer
    assert get_reward_fn("math")(output.str_output, "42") == 1.0
    assert get_reward_fn("math")(output.str_output, "41") == 0.0


@pytest.mark.usefixtures("sandbox_boundary")
def test_hostile_code_gets_error_tool_messages_and_the_trajectory_completes(
    scripted_engine_factory, tokenizer, tmp_path
):
    kill = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"
    bomb = "import os\nwhile True: os.fork()"
    engine = RecordingScripted(
        scripted_engine_factory(
            [
                tool_call_text("execute_python", {"code": kill})
                + "\n"
                + tool_call_text("execute_python", {"code": bomb}),
                tool_call_text("execute_python", {"source": "print(1)"})
                + "\n"
                + tool_call_text("shell", {"cmd": "ls"}),
                "\\boxed{42}",
            ]
        )
    )
    output = run_agent(engine, tokenizer, fast_cfg(tmp_path))
    assert_token_invariants(output, engine)
    assert output.extra_fields["num_model_turns"] == 3 and output.extra_fields["num_tool_calls"] == 4
    assert output.extra_fields["num_tool_errors"] == 4
    assert "PermissionError: sandbox: sending signals" in output.str_output
    assert "os.fork" in output.str_output
    assert "execute_python needs one argument, `code`" in output.str_output
    assert "Error: unknown tool 'shell'" in output.str_output
    assert get_reward_fn("math")(output.str_output, "42") == 1.0


@pytest.mark.usefixtures("sandbox_boundary")
def test_turn_limit_ends_the_loop(scripted_engine_factory, tokenizer, tmp_path):
    cfg = tmp_path / "two_turns.yaml"
    cfg.write_text("max_ai_message_turn: 2\n")
    call = tool_call_text("execute_python", {"code": "print(1)"})
    engine = RecordingScripted(scripted_engine_factory([call, call, call]))
    output = run_agent(engine, tokenizer, cfg)
    assert output.extra_fields["num_model_turns"] == 2 and len(engine.outputs) == 2


class FakeRemoteRunner:
    """Stands in for a remote sandbox service's client."""

    def __init__(self) -> None:
        self.codes: list[str] = []

    async def arun(self, code: str) -> SandboxResult:
        self.codes.append(code)
        return SandboxResult(
            stdout="remote says 42\n", stderr="", exit_code=0, timed_out=False, truncated=False, error=None
        )


def make_fake_runner() -> FakeRemoteRunner:
    return FakeRemoteRunner()


def test_a_remote_runner_plugs_in(scripted_engine_factory, tokenizer, tmp_path):
    replies = [tool_call_text("execute_python", {"code": "print(6*7)"}), "\\boxed{42}"]
    runner = FakeRemoteRunner()
    output = run_agent(RecordingScripted(scripted_engine_factory(list(replies))), tokenizer, code_runner=runner)
    assert runner.codes == ["print(6*7)"] and "remote says 42" in output.str_output
    # The same through the agent YAML: `code_runner: "module:factory"`.
    cfg = tmp_path / "remote.yaml"
    cfg.write_text('code_runner: "test_mathcode_agent:make_fake_runner"\n')
    output = run_agent(RecordingScripted(scripted_engine_factory(list(replies))), tokenizer, cfg)
    assert "remote says 42" in output.str_output


def test_a_sandbox_without_its_boundary_needs_the_opt_in(scripted_engine_factory, tokenizer, tmp_path, monkeypatch):
    without_bubblewrap(monkeypatch)
    engine = RecordingScripted(
        scripted_engine_factory([tool_call_text("execute_python", {"code": "print(6*7)"}), "\\boxed{42}"])
    )
    with pytest.raises(UserInputError, match="allow_weak_sandbox: true") as refused:
        run_agent(engine, tokenizer, fast_cfg(tmp_path))
    assert "missing bwrap" in str(refused.value)
    opted_in = tmp_path / "weak_ok.yaml"
    opted_in.write_text(fast_cfg(tmp_path).read_text() + "allow_weak_sandbox: true\n")
    output = run_agent(engine, tokenizer, opted_in)
    assert "<tool_response>\n42\n</tool_response>" in output.str_output
