"""ToolLoopAgentGraph: the shape of the seed's examples, a model node and a tool node in a LangGraph loop.

``agent`` (model) -> [tool calls?] -> ``tools`` -> ``agent`` ... ; it ends when the model calls no tool, after
``cfg.max_ai_message_turn`` model turns, or past ``cfg.max_total_token_length`` tokens. Subclasses name their
``tools`` and say how one call runs (:meth:`ToolLoopAgentGraph.run_tool`); malformed calls are answered with
the parser's error, so the model can correct itself.

Every tool call of a turn is answered (``cfg.max_parallel_calls``: at most this many; null, the default, for all).
The seed's ``CustomChatModel`` keeps one call per turn; an agent built on :class:`~lit_agentrl.agents.ChatModel`
directly gets that default too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END

from lit_agentrl.agents.base import AgentGraphOutput
from lit_agentrl.agents.chat_graph import MODEL_NODE, ChatAgentGraph, ChatState
from lit_agentrl.agents.chat_model import find_last_ai_index
from lit_agentrl.agents.config import cfg_get

DEFAULT_MAX_AI_MESSAGE_TURN = 3
DEFAULT_MAX_TOTAL_TOKEN_LENGTH = 4096
TOOLS_NODE = "tools"
"""The name of the node that answers the model's tool calls."""


def error_message(call: Mapping[str, Any], text: str) -> ToolMessage:
    """A tool answer telling the model what went wrong with its call."""
    call_id = call.get("id") or "invalid"
    return ToolMessage(content=f"Error: {text}", name=call.get("name"), tool_call_id=call_id, status="error")


class ToolLoopAgentGraph(ChatAgentGraph):
    """A model/tools loop with the seed's stopping rules; subclasses set ``tools`` and :meth:`run_tool`."""

    tools: ClassVar[list[Any]] = []
    default_max_turns = DEFAULT_MAX_AI_MESSAGE_TURN

    def __init__(
        self, agent_name: str, cfg: Any, llm: Any, tokenizer: Any, processor: Any = None, **kwargs: Any
    ) -> None:
        self.max_turns = int(cfg_get(cfg, "max_ai_message_turn", self.default_max_turns))
        self.max_tokens = int(cfg_get(cfg, "max_total_token_length", DEFAULT_MAX_TOTAL_TOKEN_LENGTH))
        calls = cfg_get(cfg, "max_parallel_calls", None)
        self.max_parallel_calls = None if calls is None else int(calls)
        super().__init__(agent_name, cfg, llm, tokenizer, processor, **kwargs)

    def build_graph(self) -> Any:
        self.tools_by_name = {t.name: t for t in self.tools}
        model = self.make_chat_model().model_copy(update={"max_parallel_calls": self.max_parallel_calls})
        self.chatmodel = model.bind_tools(self.tools)
        workflow = self.chat_workflow()
        workflow.add_node(TOOLS_NODE, self._call_tools)
        workflow.add_conditional_edges(MODEL_NODE, self._should_continue, {"continue": TOOLS_NODE, "end": END})
        workflow.add_edge(TOOLS_NODE, MODEL_NODE)
        self.graph = workflow.compile()
        return self.graph

    async def run_tool(self, call: Mapping[str, Any], config: RunnableConfig) -> ToolMessage:
        """Answer one parsed tool call (``name``, ``args``, ``id``); never raises for the model's mistakes."""
        raise NotImplementedError

    def run_config(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """What the nodes need from the row (``config["configurable"]``), beside the sampling parameters and the chat
        model: by default the row's ``ground_truth`` (as the seed's graphs pass it)."""
        return {"ground_truth": kwargs.get("ground_truth")}

    async def run(self, messages: Sequence[Any], sampling_params: Mapping[str, Any], **kwargs: Any) -> AgentGraphOutput:
        state = await self.invoke_graph(messages, sampling_params, **self.run_config(kwargs))
        output = self.convert_agent_graph_output(state)
        kept = state["messages"][: find_last_ai_index(state["messages"]) + 1]
        errors = sum(1 for m in kept if isinstance(m, ToolMessage) and m.status == "error")
        output.extra_fields["num_tool_errors"] = errors
        return output

    async def _call_tools(self, state: ChatState, config: RunnableConfig) -> dict[str, list[ToolMessage]]:
        last = _model_turn(state)
        results = list(await asyncio.gather(*(self._answer(call, config) for call in last.tool_calls)))
        results += [error_message(bad, str(bad["error"])) for bad in last.invalid_tool_calls]
        return {"messages": results}

    async def _answer(self, call: Mapping[str, Any], config: RunnableConfig) -> ToolMessage:
        if call["name"] not in self.tools_by_name:
            return error_message(call, f"unknown tool {call['name']!r}; available: {sorted(self.tools_by_name)}")
        return await self.run_tool(call, config)

    def _should_continue(self, state: ChatState) -> str:
        messages = state["messages"]
        last = _model_turn(state)
        model_turns = sum(1 for m in messages if m.type == "ai")
        if not (last.tool_calls or last.invalid_tool_calls):
            return "end"
        if model_turns >= self.max_turns or len(last.response_metadata["token_ids"]) >= self.max_tokens:
            return "end"
        return "continue"


def _model_turn(state: ChatState) -> AIMessage:
    """The model's turn that ends the conversation (the nodes after the model node see it last)."""
    last = state["messages"][-1]
    if not isinstance(last, AIMessage):
        raise TypeError(f"expected the model's turn last in the conversation, got a {type(last).__name__}")
    return last
