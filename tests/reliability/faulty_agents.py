"""Fault-injecting agents for the reliability tests; importable by path through ``data.agent_modules``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import BaseMessage, ToolMessage
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents import AgentGraph, register, register_openai_agent


@register("always_raises_agent")
class AlwaysRaises(AgentGraph):
    async def run(self, messages, sampling_params, **kwargs):
        raise ValueError("injected agent fault")


class _State(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]


@register("hanging_tool_agent")
class HangingTool(AgentGraph):
    """One model turn, then a tool node that never returns (a dead sandbox or search service)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.build_graph()
        workflow = StateGraph(_State)
        workflow.add_node("agent", self._model)
        workflow.add_node("tools", self._hang)
        workflow.set_entry_point("agent")
        workflow.add_edge("agent", "tools")
        workflow.add_edge("tools", END)
        self.graph = workflow.compile()

    async def _model(self, state, config):
        return {
            "messages": [await self.chatmodel.ainvoke(state["messages"], sampling_params=config["configurable"]["sp"])]
        }

    async def _hang(self, state, config):
        await asyncio.sleep(3600)
        return {"messages": [ToolMessage(content="never", tool_call_id="x")]}

    async def run(self, messages, sampling_params, **kwargs):
        state = await self.graph.ainvoke({"messages": list(messages)}, config={"configurable": {"sp": sampling_params}})
        return self.convert_agent_graph_output(state)


@register_openai_agent("overlong_prompt_agent")
async def overlong_prompt(client: Any, row: dict, cfg: Any) -> float:
    """Sends a prompt far past the engine's context (a tool that returned a whole file): refused with a 400 before it
    reaches the engine, which the agent does not catch."""
    flood = [{"role": "user", "content": "7 " * 200_000}]
    await client.chat.completions.create(model="policy", messages=flood)
    return 1.0


MISBEHAVING_PROGRAM = """
import json, subprocess, sys
import openai
json.load(sys.stdin)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a child left holding stdout
openai.OpenAI().chat.completions.create(model="policy", messages=[{"role": "user", "content": "1 ="}])
print("reward is one")  # not a result line
"""
