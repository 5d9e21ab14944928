"""Fault-injecting agents for the reliability tests; importable by path through ``data.agent_modules``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import BaseMessage, ToolMessage
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents import AgentGraph, register


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
