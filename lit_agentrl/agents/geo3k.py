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

from langgraph.graph import END

from lit_agentrl.agents.base import AgentGraphOutput
from lit_agentrl.agents.chat_graph import MODEL_NODE, ChatAgentGraph
from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.multimodal import attach_images
from lit_agentrl.agents.registry import register


@register("geo3k_agent")
class Geo3kAgentGraph(ChatAgentGraph):
    """One model turn on the problem with its figure(s)."""

    def build_graph(self) -> Any:
        self.chatmodel = self.make_chat_model()
        workflow = self.chat_workflow()
        workflow.add_edge(MODEL_NODE, END)
        self.graph = workflow.compile()
        return self.graph

    async def run(
        self, messages: Sequence[Any], sampling_params: dict[str, Any], images: list[Any] | None = None, **kwargs: Any
    ) -> AgentGraphOutput:
        prompt = attach_images(messages, images)
        system_prompt = cfg_get(self.cfg, "system_prompt", None)
        if system_prompt and not (prompt and isinstance(prompt[0], dict) and prompt[0].get("role") == "system"):
            prompt.insert(0, {"role": "system", "content": system_prompt})
        return self.convert_agent_graph_output(await self.invoke_graph(prompt, sampling_params))
