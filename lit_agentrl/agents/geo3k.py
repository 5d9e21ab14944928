"""``geo3k_agent``: Geometry3K's vision-language agent (the seed's ``geo3k_agent_graph.py`` task), one model turn.

The rows ``data/prepare_geo3k.py`` writes carry the figure(s) in ``images`` and an ``<image>`` placeholder in the
problem text; the agent puts each image there as a content part (:func:`~lit_agentrl.agents.multimodal.attach_images`)
and the model answers once. The row's ``data_source`` (``hiyouga/geometry3k``) selects the ``geo3k`` reward.

Agent YAML keys (all optional, ``configs/agents/geo3k.yaml``): ``system_prompt``, prepended when the row's prompt
has no system message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_agentrl.agents.base import AgentGraphOutput
from lit_agentrl.agents.multimodal import attach_images
from lit_agentrl.agents.registry import register
from lit_agentrl.agents.single_turn import SingleTurnAgentGraph


@register("geo3k_agent")
class Geo3kAgentGraph(SingleTurnAgentGraph):
    """``single_turn`` on the problem with its figure(s) put in place of its ``<image>`` placeholders."""

    async def run(
        self, messages: Sequence[Any], sampling_params: dict[str, Any], images: list[Any] | None = None, **kwargs: Any
    ) -> AgentGraphOutput:
        return await super().run(attach_images(messages, images), sampling_params, **kwargs)
