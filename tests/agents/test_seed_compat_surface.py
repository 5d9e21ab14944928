"""The names and behaviours the seed's three example graphs use, beyond ``math_eval_agent_graph.py``'s.

``geo3k_agent_graph.py``: ``self.model_type``, ``self.processor``, ``CustomChatModel(processor=, model_type=)``,
``acc_reward``; ``math_code_agent_graph.py``: ``execute_python_code``; all: ``max_parallel_calls`` 1,
``find_first_ai_index``/``find_last_ai_index``, and the ``config["configurable"]`` keys their nodes read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from support import tool_call_text

from lit_agentrl.agents import AgentGraph, BaseAgentGraph, CustomChatModel, find_first_ai_index, find_last_ai_index
from lit_agentrl.agents.tool_loop import ToolLoopAgentGraph
from lit_agentrl.rows import agent_run_kwargs

SAMPLING = {"max_new_tokens": 64, "temperature": 1.0}


class _Graph(BaseAgentGraph):
    async def run(self, messages, sampling_params, **kwargs):
        raise NotImplementedError


class _Processor:
    """A processor's stand-in: loaded from a folder (``name_or_path``), holding the tokenizer."""

    def __init__(self, folder: Path, tokenizer: Any = None) -> None:
        self.name_or_path = str(folder)
        self.tokenizer = tokenizer


# ------------------------------------------------------------------ AgentGraph.model_type / processor


def test_model_type_is_the_seeds_llm_or_vlm(tmp_path: Path, tokenizer) -> None:
    graph = _Graph("g", None, llm=None, tokenizer=tokenizer)
    assert graph.model_type == "llm" and graph.processor is None
    processor = _Processor(tmp_path)
    graph = _Graph("g", None, llm=None, tokenizer=tokenizer, processor=processor)
    assert graph.model_type == "vlm" and graph.processor is processor
    assert _Graph("g", None, None, tokenizer, None, model_type="vlm").model_type == "vlm"
    assert AgentGraph is BaseAgentGraph


# ------------------------------------------------------------------ CustomChatModel


def test_custom_chat_model_takes_processor_and_model_type(tmp_path: Path, tokenizer) -> None:
    processor = _Processor(tmp_path)
    model = CustomChatModel(model="geo3k", llm=None, tokenizer=tokenizer, processor=processor, model_type="vlm")
    assert model.processor is processor and model.model_type == "vlm"
    assert model.max_parallel_calls == 1  # the seed's default


IMAGE_MESSAGE = HumanMessage(
    content=[{"type": "image_url", "image_url": {"url": "file:///fig.png"}}, {"type": "text", "text": "Find x."}]
)


def test_an_image_is_never_dropped(scripted_engine_factory, tokenizer) -> None:
    """Without a processor (a text policy) an image fails loudly; with one it is rendered (tests/vision)."""
    engine = scripted_engine_factory(["never generated"])
    model = CustomChatModel(model="geo3k_agent", llm=engine, tokenizer=tokenizer, processor=None)
    with pytest.raises(ValueError, match=r"agent 'geo3k_agent': message 1 .*image"):
        asyncio.run(model.ainvoke([SystemMessage("s"), IMAGE_MESSAGE], sampling_params=SAMPLING))
    assert engine.calls == []  # failed before reaching the engine


def test_one_tool_call_per_turn_by_default(scripted_engine_factory, tokenizer) -> None:
    two_calls = tool_call_text("f", {"x": 1}) + "\n" + tool_call_text("f", {"x": 2})
    for limit, kept in ((1, [1]), (None, [1, 2])):
        engine = scripted_engine_factory([two_calls])
        kwargs = {} if limit == 1 else {"max_parallel_calls": None}
        model = CustomChatModel(model="m", llm=engine, tokenizer=tokenizer, **kwargs)
        message = asyncio.run(model.ainvoke([HumanMessage("q")], sampling_params=SAMPLING))
        assert [call["args"]["x"] for call in message.tool_calls] == kept


# ------------------------------------------------------------------ find_first_ai_index / find_last_ai_index


def test_ai_index_helpers() -> None:
    messages = [HumanMessage("q"), AIMessage("a"), ToolMessage("t", tool_call_id="1"), AIMessage("b")]
    assert (find_first_ai_index(messages), find_last_ai_index(messages)) == (1, 3)
    assert find_first_ai_index([HumanMessage("q")]) == find_last_ai_index([]) == -1


# ------------------------------------------------------------------ config["configurable"]


@tool
def peek(note: str, **kwargs: Any) -> str:
    """Report what the node saw."""
    return note


class _PeekingGraph(ToolLoopAgentGraph):
    """Its tool node reports the ``config["configurable"]`` keys the seed's nodes read."""

    tools: ClassVar[list[Any]] = [peek]
    seen: ClassVar[dict[str, Any]] = {}

    async def run_tool(self, call: Mapping[str, Any], config: RunnableConfig) -> ToolMessage:
        configurable = config["configurable"]
        _PeekingGraph.seen = {key: configurable.get(key) for key in ("chat_model", "sampling_params", "ground_truth")}
        return ToolMessage(content="seen", name=call["name"], tool_call_id=call["id"])


def test_nodes_find_chat_model_sampling_params_and_ground_truth(scripted_engine_factory, tokenizer) -> None:
    engine = scripted_engine_factory([tool_call_text("peek", {"note": "n"}), "\\boxed{4}"])
    graph = _PeekingGraph("peek_agent", None, engine, tokenizer)
    row = {"prompt": [{"role": "user", "content": "2+2?"}], "reward_model": {"ground_truth": "4"}}
    asyncio.run(graph.run(sampling_params=SAMPLING, **agent_run_kwargs(row)))
    assert _PeekingGraph.seen == {"chat_model": graph.chatmodel, "sampling_params": SAMPLING, "ground_truth": "4"}


# ------------------------------------------------------------------ the seed's reward and code tool


def test_geo3k_reward_and_code_tool_import_paths() -> None:
    from lit_agentrl.rewards.geo3k import acc_reward
    from lit_agentrl.tools import execute_python_code

    assert acc_reward("60", "60", use_boxed=False) == 1.0
    assert asyncio.iscoroutinefunction(execute_python_code)
