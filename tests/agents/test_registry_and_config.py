"""Registry routing and agent YAML loading, with errors that say what is wrong and what is valid."""

from __future__ import annotations

import sys

import pytest

from lit_agentrl.agents import get_agent_class, import_agent_modules, load_agent_cfg, register, registered_agents
from lit_agentrl.agents.base import AgentGraph
from lit_agentrl.agents.matheval import MathEvalAgentGraph
from lit_agentrl.agents.single_turn import SingleTurnAgentGraph


def test_builtin_agents_are_registered():
    assert get_agent_class("matheval_agent") is MathEvalAgentGraph
    assert get_agent_class("single_turn") is SingleTurnAgentGraph


def test_unknown_agent_lists_registered_names():
    with pytest.raises(KeyError, match=r"unknown agent_name 'nope'.*matheval_agent.*single_turn"):
        get_agent_class("nope")


def test_register_rejects_empty_name():
    with pytest.raises(ValueError, match="non-empty"):
        register("")


def test_import_agent_module_by_path_runs_its_register(tmp_path):
    module = tmp_path / "my_agents_for_test.py"
    module.write_text(
        "from lit_agentrl.agents import AgentGraph, register\n"
        "@register('path_imported_agent')\n"
        "class PathAgent(AgentGraph):\n"
        "    async def run(self, messages, sampling_params, **kwargs):\n"
        "        raise NotImplementedError\n"
    )
    import_agent_modules([str(module)])
    assert "path_imported_agent" in registered_agents()
    assert issubclass(get_agent_class("path_imported_agent"), AgentGraph)
    sys.modules.pop("my_agents_for_test", None)


def test_import_agent_module_errors_name_the_module(tmp_path):
    with pytest.raises(ModuleNotFoundError, match="no_such_agents_module"):
        import_agent_modules(["no_such_agents_module"])
    with pytest.raises(FileNotFoundError, match=r"missing\.py"):
        import_agent_modules([str(tmp_path / "missing.py")])


def test_cfg_attribute_and_item_access(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("max_ai_message_turn: 5\nnested:\n  temperature: 0.5\n")
    cfg = load_agent_cfg(path)
    assert cfg.max_ai_message_turn == 5 and cfg["max_ai_message_turn"] == 5
    assert cfg.nested.temperature == 0.5
    assert load_agent_cfg(None) is None and load_agent_cfg("") is None


@pytest.mark.parametrize(
    "content, error, fragment",
    [
        (None, FileNotFoundError, "does not exist"),
        ("a: [1, 2\n", ValueError, "not valid YAML"),
        ("- 1\n- 2\n", ValueError, "must be a YAML mapping"),
    ],
)
def test_bad_agent_yaml_names_the_file(tmp_path, content, error, fragment):
    path = tmp_path / "bad_agent.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(error, match=fragment) as info:
        load_agent_cfg(path)
    assert "bad_agent.yaml" in str(info.value)


def test_matheval_reads_its_limits_from_cfg(engine, tokenizer, tmp_path):
    path = tmp_path / "math.yaml"
    path.write_text("max_ai_message_turn: 7\nmax_total_token_length: 99\n")
    graph = MathEvalAgentGraph("matheval_agent", load_agent_cfg(path), engine, tokenizer)
    assert (graph.max_turns, graph.max_tokens) == (7, 99)
