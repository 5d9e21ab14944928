"""ToolLoopAgentGraph: the shape of the seed's examples, a model node and a tool node in a LangGraph loop.

``agent`` (model) -> [tool calls?] -> ``tools`` -> ``agent`` ... ; it ends when the model calls no tool, after
``cfg.max_ai_message_turn`` model turns, or past ``cfg.max_total_token_length`` tokens. Subclasses name their
``tools`` and say how one call runs (:meth:`ToolLoopAgentGraph.run_tool`); malformed calls are answered with
the parser's error, so the model can correct itself.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Sequence, TypedDict

from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents.base import AgentGraph, AgentGraphOutput
from lit_agentrl.agents.chat_model import ChatModel, find_last_ai_index

DEFAULT_MAX_AI_MESSAGE_TURN = 3
DEFAULT_MAX_TOTAL_TOKEN_LENGTH = 4096


class ToolLoopState(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]


def cfg_get(cfg: Any, key: str, default: Any) -> Any:
    """``cfg.key`` when the agent YAML sets it, else ``default``."""
    if cfg is None:
        return default
    value = cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
    return default if value is None else value


def error_message(call: dict, text: str) -> ToolMessage:
    """A tool answer telling the model what went wrong with its call."""
    return ToolMessage(content=f"Error: {text}", name=call.get("name"), tool_call_id=call.get("id") or "invalid", status="error")


class ToolLoopAgentGraph(AgentGraph):
    """A model/tools loop with the seed's stopping rules; subclasses set ``tools`` and :meth:`run_tool`."""

    tools: list[Any] = []
    default_max_turns = DEFAULT_MAX_AI_MESSAGE_TURN

    def __init__(self, agent_name: str, cfg: Any, llm: Any, tokenizer: Any, processor: Any = None, **kwargs: Any) -> None:
        super().__init__(agent_name, cfg, llm, tokenizer, processor, **kwargs)
        self.max_turns = int(cfg_get(cfg, "max_ai_message_turn", self.default_max_turns))
        self.max_tokens = int(cfg_get(cfg, "max_total_token_length", DEFAULT_MAX_TOTAL_TOKEN_LENGTH))
        self.build_graph()

    def build_graph(self) -> Any:
        self.tools_by_name = {t.name: t for t in self.tools}
        self.chatmodel = ChatModel(model=self.agent_name, llm=self.llm, tokenizer=self.tokenizer).bind_tools(self.tools)
        workflow = StateGraph(ToolLoopState)
        workflow.add_node("agent", self._call_model)
        workflow.add_node("tools", self._call_tools)
        workflow.set_entry_point("agent")
        workflow.add_conditional_edges("agent", self._should_continue, {"continue": "tools", "end": END})
        workflow.add_edge("tools", "agent")
        self.graph = workflow.compile()
        return self.graph

    async def run_tool(self, call: dict, config: RunnableConfig) -> ToolMessage:
        """Answer one parsed tool call (``name``, ``args``, ``id``); never raises for the model's mistakes."""
        raise NotImplementedError

    def run_config(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """What the nodes need from the row (``config["configurable"]``), beside the sampling parameters."""
        return {}

    async def run(self, messages: Sequence[Any], sampling_params: dict[str, Any], **kwargs: Any) -> AgentGraphOutput:
        config = {"configurable": {"sampling_params": sampling_params, **self.run_config(kwargs)}}
        state = await self.graph.ainvoke({"messages": list(messages)}, config=config)
        output = self.convert_agent_graph_output(state)
        kept = state["messages"][: find_last_ai_index(state["messages"]) + 1]
        output.extra_fields["num_tool_errors"] = sum(1 for m in kept if isinstance(m, ToolMessage) and m.status == "error")
        return output

    async def _call_model(self, state: ToolLoopState, config: RunnableConfig) -> dict:
        params = config["configurable"]["sampling_params"]
        return {"messages": [await self.chatmodel.ainvoke(state["messages"], sampling_params=params)]}

    async def _call_tools(self, state: ToolLoopState, config: RunnableConfig) -> dict:
        last = state["messages"][-1]
        results = list(await asyncio.gather(*(self._answer(call, config) for call in last.tool_calls)))
        results += [error_message(bad, bad["error"]) for bad in last.invalid_tool_calls]
        return {"messages": results}

    async def _answer(self, call: dict, config: RunnableConfig) -> ToolMessage:
        if call["name"] not in self.tools_by_name:
            return error_message(call, f"unknown tool {call['name']!r}; available: {sorted(self.tools_by_name)}")
        return await self.run_tool(call, config)

    def _should_continue(self, state: ToolLoopState) -> str:
        messages = state["messages"]
        last = messages[-1]
        model_turns = sum(1 for m in messages if m.type == "ai")
        if not (last.tool_calls or last.invalid_tool_calls):
            return "end"
        if model_turns >= self.max_turns or len(last.response_metadata["token_ids"]) >= self.max_tokens:
            return "end"
        return "continue"
