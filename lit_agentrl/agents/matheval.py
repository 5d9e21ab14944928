"""``matheval_agent``: the seed's example. The model reasons, calls a checking tool with its answer, may refine.

A :class:`~lit_agentrl.agents.tool_loop.ToolLoopAgentGraph`: it ends when the model calls no tool, after
``cfg.max_ai_message_turn`` model turns, or past ``cfg.max_total_token_length`` tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool

from lit_agentrl.agents.registry import register
from lit_agentrl.agents.tool_loop import ToolLoopAgentGraph, error_message
from lit_agentrl.rewards.math import is_equiv


@tool
def mathlighteval_reward(answer: str, **kwargs: Any) -> str:
    """Check a final answer to the math problem. Returns whether the answer is correct."""
    return "The answer is correct." if is_equiv(answer, kwargs["ground_truth"]) else "The answer is wrong."


@register("matheval_agent")
class MathEvalAgentGraph(ToolLoopAgentGraph):
    """The seed's math agent: a model node and a tool node that checks the answer against the ground truth."""

    tools: ClassVar[list[Any]] = [mathlighteval_reward]

    def run_config(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"ground_truth": kwargs["ground_truth"]}

    async def run_tool(self, call: Mapping[str, Any], config: RunnableConfig) -> ToolMessage:
        check = self.tools_by_name[call["name"]].func
        ground_truth = config["configurable"]["ground_truth"]
        try:
            # The answer check is synchronous sympy work: keep it off the event loop.
            content = await asyncio.get_running_loop().run_in_executor(
                None, lambda: check(**call["args"], ground_truth=ground_truth)
            )
        except Exception as exc:  # a bad argument from the model is the model's mistake: tell it
            return error_message(call, f"{type(exc).__name__}: {exc}")
        return ToolMessage(content=str(content), name=call["name"], tool_call_id=call["id"], status="success")
