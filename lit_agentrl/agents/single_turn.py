"""``single_turn``: one model turn on the chat prompt, for plain GRPO; the reward function scores it.

Agent YAML keys (all optional): ``system_prompt``, prepended when the row's prompt has no system message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langgraph.graph import END

from lit_agentrl.agents.base import AgentGraphOutput
from lit_agentrl.agents.chat_graph import MODEL_NODE, ChatAgentGraph
from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.registry import register


@register("single_turn")
class SingleTurnAgentGraph(ChatAgentGraph):
    """A one-node graph: the model answers the prompt once."""

    def build_graph(self) -> Any:
        self.chatmodel = self.make_chat_model()
        workflow = self.chat_workflow()
        workflow.add_edge(MODEL_NODE, END)
        self.graph = workflow.compile()
        return self.graph

    async def run(self, messages: Sequence[Any], sampling_params: Mapping[str, Any], **kwargs: Any) -> AgentGraphOutput:
        messages = list(messages)
        system_prompt = cfg_get(self.cfg, "system_prompt", None)
        if system_prompt and not (messages and _role(messages[0]) == "system"):
            messages.insert(0, {"role": "system", "content": system_prompt})
        return self.convert_agent_graph_output(await self.invoke_graph(messages, sampling_params))


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else getattr(message, "type", None)
