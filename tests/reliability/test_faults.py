"""Faults inside a step are counted and survived; too many of them stop the run with the reasons."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import faulty_agents  # noqa: F401  registers the fault-injecting agents
import pytest
import yaml
from support import MATH_SAMPLE_TRAIN, REPO_ROOT, tool_call_text

from lit_agentrl.agents.config import load_agent_cfg
from lit_agentrl.agents.matheval import MathEvalAgentGraph
from lit_agentrl.engines.base import EngineWrapper
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rows import agent_run_kwargs

HERE = Path(__file__).resolve().parent


def math_row() -> dict:
    with open(MATH_SAMPLE_TRAIN) as f:
        return json.loads(f.readline())


def test_a_tool_that_raises_answers_the_model_with_the_error(scripted_engine_factory, tokenizer):
    engine = scripted_engine_factory([tool_call_text("mathlighteval_reward", {"wrong_arg": "3"}), "ok \\boxed{3}"])
    graph = MathEvalAgentGraph("matheval_agent", load_agent_cfg(None), engine, tokenizer)
    output = asyncio.run(graph.run(sampling_params={"max_new_tokens": 64}, **agent_run_kwargs(math_row())))
    assert "Error: TypeError" in output.str_output
    assert output.extra_fields["num_model_turns"] == 2


def test_hanging_tool_times_out_and_is_counted(engine, tokenizer):
    rows = [{"agent_name": "hanging_tool_agent", "prompt": [{"role": "user", "content": "hi"}], "ground_truth": "1"}]
    manager = RolloutManager([engine], tokenizer, trajectory_timeout_s=0.5, reward_fn="math")
    batch = manager.generate(rows, n_samples=3, sampling_params={"max_new_tokens": 8})
    manager.close()
    assert batch.stats.num_failed == 3
    assert all(t.failure_reason.startswith("timeout") for t in batch.trajectories)


class FlakyEngine(EngineWrapper):
    """Every other request fails, as an engine that lost a worker or rejected a request would."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    async def async_generate(self, **kwargs):
        self.calls += 1
        if self.calls % 2 == 0:
            raise ConnectionError("injected engine fault")
        return await self.inner.async_generate(**kwargs)


def test_engine_errors_fail_only_their_trajectories(engine, tokenizer):
    rows = [json.loads(line) for line in Path(MATH_SAMPLE_TRAIN).read_text().splitlines()][:4]
    manager = RolloutManager([FlakyEngine(engine)], tokenizer, reward_fn="math")
    batch = manager.generate(rows, n_samples=2, sampling_params={"max_new_tokens": 8})
    failed = [t for t in batch.trajectories if t.failed]
    assert 0 < len(failed) < 8
    assert all(t.failure_reason == "ConnectionError: injected engine fault" for t in failed)
    assert batch.stats.failure_reasons["ConnectionError: injected engine fault"] == len(failed)
    assert all(t.num_generated_tokens > 0 for t in batch.trajectories if not t.failed)


@pytest.mark.slow
def test_too_many_failures_stop_the_run_quoting_the_reasons(tmp_path, quickstart_model_dir):
    from support import quick_config

    from lit_agentrl.cli import main

    data = tmp_path / "faulty.jsonl"
    row = {"agent_name": "always_raises_agent", "prompt": [{"role": "user", "content": "1 ="}], "ground_truth": "2"}
    data.write_text((json.dumps(row) + "\n") * 8)
    path = quick_config(tmp_path, quickstart_model_dir, steps=2)
    config = yaml.safe_load(path.read_text())
    config["data"].update(
        {"train_files": str(data), "val_files": None, "agent_modules": [str(HERE / "faulty_agents.py")]}
    )
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(RuntimeError, match=r"16 of 16 trajectories failed .* 16 x ValueError: injected agent fault"):
        main(["fit", "--config", str(path)])


@pytest.mark.slow
def test_a_fit_with_a_hung_agent_an_overlong_prompt_and_a_misbehaving_program_finishes_every_step(
    tmp_path, quickstart_model_dir, caplog
):
    """Each step holds one hung agent, one prompt past the engine's context and one program that leaves a child
    holding its stdout and prints no result: every step finishes, each failure counted and named."""
    from faulty_agents import MISBEHAVING_PROGRAM
    from support import quick_config, read_csv

    from lit_agentrl.cli import main

    program = tmp_path / "misbehaving.py"
    program.write_text(MISBEHAVING_PROGRAM)
    program_cfg = tmp_path / "program.yaml"
    program_cfg.write_text(yaml.safe_dump({"command": ["python", str(program)]}))
    rows = [json.loads(line) for line in (REPO_ROOT / "data/quickstart/train.jsonl").open()][:5]
    rows += [
        {**rows[0], "agent_name": "hanging_tool_agent"},
        {**rows[0], "agent_name": "overlong_prompt_agent"},
        {**rows[0], "agent_name": "openai_command", "agent_cfg_path": str(program_cfg)},
    ]
    data = tmp_path / "faulty.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    path = quick_config(tmp_path, quickstart_model_dir, steps=2, n_samples=2)
    config = yaml.safe_load(path.read_text())
    config["data"].update(
        train_files=str(data), val_files=None, prompts_per_step=8, shuffle=False,
        agent_modules=[str(HERE / "faulty_agents.py")],
    )  # fmt: skip
    (rollout,) = [c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("RolloutCallback")]
    rollout["init_args"]["health"] = {"trajectory_timeout_s": 5}
    path.write_text(yaml.safe_dump(config))
    with caplog.at_level(logging.WARNING, logger="lit_agentrl.rollout.health"):
        main(["fit", "--config", str(path)])
    steps = [r for r in read_csv(next(tmp_path.rglob("metrics.csv"))) if r.get("rollout/failed")]
    assert len(steps) == 2 and all(float(r["rollout/failed"]) == 6.0 for r in steps)
    reports = [r.message for r in caplog.records if "trajectories failed" in r.message]
    assert len(reports) == 2
    for report in reports:
        assert "6 of 16 trajectories failed" in report
        assert "2 x timeout: trajectory exceeded 5.0s" in report
        assert "context_length_exceeded" in report or "context length" in report
        assert "it printed: 'reward is one'" in report
