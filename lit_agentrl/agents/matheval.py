"""``matheval_agent``: the seed's example. The model reasons, calls a checking tool with its answer, may refine.

Graph: ``agent`` (model) -> [tool calls?] -> ``tools`` -> ``agent`` ... ; it ends when the model calls no
tool, after ``cfg.max_ai_message_turn`` model turns, or past ``cfg.max_total_token_length`` tokens.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Sequence, TypedDict

from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents.base import AgentGraph, AgentGraphOutput
from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.agents.registry import register
from lit_agentrl.rewards.math import is_equiv

DEFAULT_MAX_AI_MESSAGE_TURN = 3
DEFAULT_MAX_TOTAL_TOKEN_LENGTH = 4096


class MathEvalState(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]


@tool
def mathlighteval_reward(answer: str, **kwargs: Any) -> str:
    """Check a final answer to the math problem. Returns whether the answer is correct."""
    return "The answer is correct." if is_equiv(answer, kwargs["ground_truth"]) else "The answer is wrong."


@register("matheval_agent")
class MathEvalAgentGraph(AgentGraph):
    """The seed's math agent: a model node and a tool node that checks the answer against the ground truth."""

    tools = [mathlighteval_reward]

    def __init__(self, agent_name: str, cfg: Any, llm: Any, tokenizer: Any, processor: Any = None, **kwargs: Any) -> None:
        super().__init__(agent_name, cfg, llm, tokenizer, processor, **kwargs)
        self.max_turns = int(_cfg_get(cfg, "max_ai_message_turn", DEFAULT_MAX_AI_MESSAGE_TURN))
        self.max_tokens = int(_cfg_get(cfg, "max_total_token_length", DEFAULT_MAX_TOTAL_TOKEN_LENGTH))
        self.build_graph()

    def build_graph(self) -> Any:
        self.tools_by_name = {t.name: t for t in self.tools}
        self.chatmodel = ChatModel(model=self.agent_name, llm=self.llm, tokenizer=self.tokenizer).bind_tools(self.tools)
        workflow = StateGraph(MathEvalState)
        workflow.add_node("agent", self._call_model)
        workflow.add_node("tools", self._call_tools)
        workflow.set_entry_point("agent")
        workflow.add_conditional_edges("agent", self._should_continue, {"continue": "tools", "end": END})
        workflow.add_edge("tools", "agent")
        self.graph = workflow.compile()
        return self.graph

    async def _call_model(self, state: MathEvalState, config: RunnableConfig) -> dict:
        params = config["configurable"]["sampling_params"]
        return {"messages": [await self.chatmodel.ainvoke(state["messages"], sampling_params=params)]}

    async def _call_tools(self, state: MathEvalState, config: RunnableConfig) -> dict:
        last = state["messages"][-1]
        ground_truth = config["configurable"]["ground_truth"]
        results = list(await asyncio.gather(*(self._run_tool(call, ground_truth) for call in last.tool_calls)))
        results += [
            ToolMessage(content=f"Error: {bad['error']}", tool_call_id=bad["id"] or "invalid", status="error")
            for bad in last.invalid_tool_calls
        ]
        return {"messages": results}

    async def _run_tool(self, call: dict, ground_truth: str) -> ToolMessage:
        chosen = self.tools_by_name.get(call["name"])
        if chosen is None:
            return ToolMessage(content=f"Error: unknown tool {call['name']!r}", tool_call_id=call["id"], status="error")
        try:
            # The answer check is synchronous sympy work: keep it off the event loop.
            content = await asyncio.get_running_loop().run_in_executor(
                None, lambda: chosen.func(**call["args"], ground_truth=ground_truth)
            )
        except Exception as exc:  # a bad argument from the model is the model's mistake: tell it
            content, status = f"Error: {type(exc).__name__}: {exc}", "error"
        else:
            status = "success"
        return ToolMessage(content=str(content), name=call["name"], tool_call_id=call["id"], status=status)

    def _should_continue(self, state: MathEvalState) -> str:
        messages = state["messages"]
        last = messages[-1]
        model_turns = sum(1 for m in messages if m.type == "ai")
        total_tokens = len(last.response_metadata["token_ids"])
        if not (last.tool_calls or last.invalid_tool_calls):
            return "end"
        if model_turns >= self.max_turns or total_tokens >= self.max_tokens:
            return "end"
        return "continue"

    async def run(self, messages: Sequence[Any], sampling_params: dict[str, Any], **kwargs: Any) -> AgentGraphOutput:
        config = {"configurable": {"sampling_params": sampling_params, "ground_truth": kwargs["ground_truth"]}}
        state = await self.graph.ainvoke({"messages": list(messages)}, config=config)
        return self.convert_agent_graph_output(state)


def _cfg_get(cfg: Any, key: str, default: Any) -> Any:
    """``cfg.key`` when the agent YAML sets it, else ``default``."""
    if cfg is None:
        return default
    value = cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
    return default if value is None else value
