"""``geo3k_agent``: Geometry3K's vision-language agent (the seed's ``geo3k_agent_graph.py`` task).

The model looks at the figure, reasons, and may check its answer with the ``calc_geo3k_reward`` tool, which says
whether the answer is right, before it gives the final answer in ``\\boxed{}``: a
:class:`~lit_agentrl.agents.matheval.MathEvalAgentGraph` with Geometry3K's checking tool. The rows'
``data_source`` (``hiyouga/geometry3k``) selects the ``geo3k`` reward.

Rows carry their figures either as image parts of the prompt's messages (``data/prepare_geo3k.py`` and the seed's
preprocessing write them so) or as an ``images`` list with ``<image>`` placeholders in the problem text (verl's
layout), which :func:`~lit_agentrl.agents.multimodal.attach_images` turns into image parts.

Agent YAML keys (``configs/agents/geo3k.yaml``): ``max_ai_message_turn``, ``max_total_token_length``,
``max_parallel_calls`` (:class:`~lit_agentrl.agents.tool_loop.ToolLoopAgentGraph`), and ``chat_template``: the
model's own template must list the tools, and Qwen2.5-VL's does not, so the shipped YAML carries one that does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from langchain_core.tools import tool

from lit_agentrl.agents.base import AgentGraphOutput
from lit_agentrl.agents.matheval import MathEvalAgentGraph
from lit_agentrl.agents.multimodal import attach_images
from lit_agentrl.agents.registry import register
from lit_agentrl.rewards.geo3k import acc_reward


@tool
def calc_geo3k_reward(answer: str, **kwargs: Any) -> str:
    """Check a final answer to the geometry problem. Returns whether the answer is correct."""
    right = acc_reward(answer, kwargs["ground_truth"], use_boxed=False)
    return "The answer is correct." if right else "The answer is wrong."


@register("geo3k_agent")
class Geo3kAgentGraph(MathEvalAgentGraph):
    """The model/tool loop of ``matheval_agent`` with Geometry3K's checking tool, on the problem and its figure(s)."""

    tools: ClassVar[list[Any]] = [calc_geo3k_reward]

    async def run(
        self,
        messages: Sequence[Any],
        sampling_params: Mapping[str, Any],
        images: list[Any] | None = None,
        **kwargs: Any,
    ) -> AgentGraphOutput:
        return await super().run(attach_images(messages, images), sampling_params, **kwargs)
