"""Multi-turn trajectories are token-exact: generated ids kept verbatim, environment turns as template suffixes."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from support import MATH_EVAL_CFG, MATH_SAMPLE_TRAIN, tool_call_text, without_bubblewrap

from lit_agentrl.agents import ChatModel, count_template_drift, load_agent_cfg
from lit_agentrl.agents.drift import expected_token_ids
from lit_agentrl.agents.matheval import MathEvalAgentGraph
from lit_agentrl.engines.base import EngineWrapper
from lit_agentrl.rows import agent_run_kwargs

SAMPLING = {"max_new_tokens": 64, "temperature": 1.0}


def math_row() -> dict:
    with open(MATH_SAMPLE_TRAIN) as f:
        return json.loads(f.readline())


def assert_token_invariants(output, engine) -> None:
    """The invariants every trajectory must satisfy, checked against what the engine actually returned."""
    ids, mask, p = output.all_token_ids, output.loss_mask, len(output.prompt_ids)
    assert ids[:p] == output.prompt_ids and not any(mask[:p]) and len(mask) == len(ids)
    generated = [t for t, m in zip(ids, mask) if m]
    assert generated == [t for reply in engine.outputs for t in reply]
    logprobs = [lp for lp, m in zip(output.response_logprobs, mask[p:]) if m]
    assert logprobs == pytest.approx([lp for reply in engine.logprobs for lp in reply])
    assert all(lp == 0.0 for lp, m in zip(output.response_logprobs, mask[p:]) if not m)
    # Each request's input is exactly the trajectory so far: nothing was re-tokenized between turns.
    for call in engine.calls:
        assert ids[: len(call)] == call


class RecordingScripted(EngineWrapper):
    """Wraps a ScriptedEngine to keep each reply's ids and logprobs."""

    def __init__(self, inner) -> None:
        self.inner, self.outputs, self.logprobs = inner, [], []

    @property
    def calls(self):
        return self.inner.calls

    async def async_generate(self, **kwargs):
        result = await self.inner.async_generate(**kwargs)
        self.outputs.append(result["output_ids"])
        self.logprobs.append([e[0] for e in result["meta_info"]["output_token_logprobs"]])
        return result


def run_matheval(engine, tokenizer, row) -> tuple:
    graph = MathEvalAgentGraph("matheval_agent", load_agent_cfg(MATH_EVAL_CFG), engine, tokenizer)
    graph.check_template_drift = True
    kwargs = agent_run_kwargs(row)
    return graph, asyncio.run(graph.run(sampling_params=SAMPLING, **kwargs))


def test_matheval_multi_turn_is_token_exact_with_zero_drift(scripted_engine_factory, tokenizer):
    row = math_row()
    answer = row["reward_model"]["ground_truth"]
    engine = RecordingScripted(
        scripted_engine_factory(
            [
                "Adding first.\n" + tool_call_text("mathlighteval_reward", {"answer": "1"}),
                tool_call_text("mathlighteval_reward", {"answer": answer}),
                f"So the answer is \\boxed{{{answer}}}.",
            ]
        )
    )
    graph, output = run_matheval(engine, tokenizer, row)
    assert_token_invariants(output, engine)
    assert output.extra_fields["num_model_turns"] == 3 and output.extra_fields["num_tool_calls"] == 2
    assert output.extra_fields["template_drift"] == 0
    assert "The answer is wrong." in output.str_output and "The answer is correct." in output.str_output
    # The first request is the prompt rendered by the chat template with the tool schema.
    tools = graph.chatmodel.kwargs["tools"]
    expected_prompt = tokenizer.apply_chat_template(
        row["prompt"], tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert output.prompt_ids == tokenizer.encode(expected_prompt, add_special_tokens=False)


def test_turn_cut_by_max_new_tokens_gets_end_of_turn_from_the_template(scripted_engine_factory, tokenizer):
    row = math_row()
    cut = tool_call_text("mathlighteval_reward", {"answer": "7"})
    engine = RecordingScripted(scripted_engine_factory([cut, "done"]))
    chat = ChatModel(model="m", llm=engine, tokenizer=tokenizer)

    async def two_turns():
        first = await chat.ainvoke(row["prompt"], sampling_params={"max_new_tokens": 5})
        reply = ToolMessage(content="keep going", tool_call_id="x")
        second = await chat.ainvoke([*row["prompt"], first, reply], sampling_params={"max_new_tokens": 5})
        return [*row["prompt"], first, reply, second], first

    messages, first = asyncio.run(two_turns())
    assert first.response_metadata["finish_reason"]["type"] == "length"
    meta = messages[-1].response_metadata
    suffix_start = len(first.response_metadata["token_ids"])
    assert meta["token_ids"][suffix_start] == tokenizer.eos_token_id  # <|im_end|> supplied, not generated
    assert meta["loss_mask"][suffix_start] == 0
    assert count_template_drift(messages, tokenizer) == 0


DRIFTING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{{ '\\n' }}{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_drift_check_counts_a_template_that_renders_history_differently(scripted_engine_factory, tokenizer):
    """Past assistant turns rendered unlike the generation prompt (an extra newline) are caught."""
    drifting = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    drifting.chat_template = DRIFTING_TEMPLATE
    chat = ChatModel(model="m", llm=scripted_engine_factory(["first", "second"]), tokenizer=drifting)
    prompt = [HumanMessage("hi")]

    async def two_turns():
        first = await chat.ainvoke(prompt, sampling_params={})
        second = await chat.ainvoke([*prompt, first, HumanMessage("again")], sampling_params={})
        return [*prompt, first, HumanMessage("again"), second]

    messages = asyncio.run(two_turns())
    actual = messages[-1].response_metadata["token_ids"]
    expected = expected_token_ids(messages, drifting)
    assert count_template_drift(messages, drifting) == sum(a != b for a, b in zip(actual, expected)) + abs(
        len(actual) - len(expected)
    )
    assert count_template_drift(messages, drifting) > 0
    assert count_template_drift(messages, tokenizer) == 0  # the same conversation under the shipped template


def test_invalid_tool_call_is_answered_with_an_error_and_the_loop_goes_on(scripted_engine_factory, tokenizer):
    row = math_row()
    engine = RecordingScripted(scripted_engine_factory(['<tool_call>\n{"name": broken\n</tool_call>', "I give up."]))
    _, output = run_matheval(engine, tokenizer, row)
    assert_token_invariants(output, engine)
    assert output.extra_fields["num_model_turns"] == 2
    assert "Error: invalid JSON" in output.str_output


def test_bind_tools_hides_kwargs_from_the_schema(engine, tokenizer):
    from lit_agentrl.agents.matheval import mathlighteval_reward

    bound = ChatModel(model="m", llm=engine, tokenizer=tokenizer).bind_tools([mathlighteval_reward])
    schema = bound.kwargs["tools"][0]["function"]
    assert schema["name"] == "mathlighteval_reward"
    assert set(schema["parameters"]["properties"]) == {"answer"}
    assert "kwargs" not in schema["parameters"].get("required", [])


def test_seed_style_agent_gets_row_fields_and_cfg(scripted_engine_factory, tokenizer, tmp_path):
    import seed_style_agent  # noqa: F401  registers calculator_agent

    from lit_agentrl.agents import get_agent_class

    cfg_path = tmp_path / "calc.yaml"
    cfg_path.write_text("max_turns: 2\n")
    engine = RecordingScripted(
        scripted_engine_factory([tool_call_text("calculate", {"expression": "6*7"}), "It is \\boxed{42}."])
    )
    graph = get_agent_class("calculator_agent")("calculator_agent", load_agent_cfg(cfg_path), engine, tokenizer)
    assert graph.cfg.max_turns == 2 and graph.cfg["max_turns"] == 2
    row = {"prompt": [{"role": "user", "content": "6 times 7?"}], "ground_truth": "42", "unit": "apples"}
    output = asyncio.run(graph.run(sampling_params=SAMPLING, **agent_run_kwargs(row)))
    assert_token_invariants(output, engine)
    assert "42" in output.str_output and output.reward_score == 1.0
    assert output.extra_fields["unit"] == "apples"


@pytest.mark.slow  # runs the model's code in the sandbox
@pytest.mark.usefixtures("sandbox_boundary")
def test_seed_style_code_agent_runs_its_code_in_our_sandbox_through_the_rollout_manager(
    scripted_engine_factory, tokenizer
):
    import seed_code_style_agent  # noqa: F401  registers seed_style_code_agent

    from lit_agentrl.rollout.manager import RolloutManager

    engine = scripted_engine_factory([tool_call_text("python", {"code": "print(6 * 7)"}), "It is \\boxed{42}."])
    row = {
        "agent_name": "seed_style_code_agent",
        "prompt": [{"role": "user", "content": "6 x 7?"}],
        "ground_truth": "42",
    }
    manager = RolloutManager([engine], tokenizer, check_template_drift=True)
    (trajectory,) = manager.generate([row], n_samples=1, sampling_params=SAMPLING).trajectories
    manager.close()
    assert not trajectory.failed, trajectory.failure_traceback
    assert trajectory.reward == 1.0 and trajectory.num_tool_calls == 1
    tool_turn = next(m for m in trajectory.messages if m["role"] == "tool")
    assert tool_turn["content"] == "<returncode>0</returncode><stdout>42\n</stdout><stderr></stderr>"
    assert trajectory.extra_fields["template_drift"] == 0


def test_a_refused_sandbox_fails_the_trajectory_even_when_the_agent_catches_it(
    scripted_engine_factory, tokenizer, monkeypatch: pytest.MonkeyPatch
):
    # The seed-style agent answers every tool exception with "tool execute error"; a sandbox without its kernel
    # boundary is a set-up fault no model can fix, so the trajectory must fail, not train on a broken tool.
    import seed_code_style_agent  # noqa: F401  registers seed_style_code_agent

    from lit_agentrl.rollout.manager import RolloutManager
    from lit_agentrl.tools import set_code_runner

    without_bubblewrap(monkeypatch)
    set_code_runner(None)
    engine = scripted_engine_factory([tool_call_text("python", {"code": "print(6 * 7)"}), "It is \\boxed{42}."])
    row = {
        "agent_name": "seed_style_code_agent",
        "prompt": [{"role": "user", "content": "6 x 7?"}],
        "ground_truth": "42",
    }
    manager = RolloutManager([engine], tokenizer)
    batch = manager.generate([row], n_samples=1, sampling_params=SAMPLING)
    manager.close()
    (trajectory,) = batch.trajectories
    assert trajectory.failed and batch.stats.num_failed == 1
    assert trajectory.failure_reason.startswith(
        "TrajectoryFault: execute_python_code: PythonSandbox: the kernel boundary cannot be built"
    )
