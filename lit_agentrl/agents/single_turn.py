"""``single_turn``: one model turn on the chat prompt, for plain GRPO; the reward function scores it.

Agent YAML keys (all optional): ``system_prompt``, prepended when the row's prompt has no system message.
"""

from __future__ import annotations

from typing import Annotated, Any, Sequence, TypedDict

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents.base import AgentGraph, AgentGraphOutput
from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.agents.registry import register


class SingleTurnState(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]


@register("single_turn")
class SingleTurnAgentGraph(AgentGraph):
    """A one-node graph: the model answers the prompt once."""

    def __init__(self, agent_name: str, cfg: Any, llm: Any, tokenizer: Any, processor: Any = None, **kwargs: Any) -> None:
        super().__init__(agent_name, cfg, llm, tokenizer, processor, **kwargs)
        self.build_graph()

    def build_graph(self) -> Any:
        self.chatmodel = ChatModel(model=self.agent_name, llm=self.llm, tokenizer=self.tokenizer)
        workflow = StateGraph(SingleTurnState)
        workflow.add_node("agent", self._call_model)
        workflow.set_entry_point("agent")
        workflow.add_edge("agent", END)
        self.graph = workflow.compile()
        return self.graph

    async def _call_model(self, state: SingleTurnState, config: RunnableConfig) -> dict:
        params = config["configurable"]["sampling_params"]
        return {"messages": [await self.chatmodel.ainvoke(state["messages"], sampling_params=params)]}

    async def run(self, messages: Sequence[Any], sampling_params: dict[str, Any], **kwargs: Any) -> AgentGraphOutput:
        messages = list(messages)
        system_prompt = self.cfg.get("system_prompt") if self.cfg is not None else None
        if system_prompt and not (messages and _role(messages[0]) == "system"):
            messages.insert(0, {"role": "system", "content": system_prompt})
        state = await self.graph.ainvoke({"messages": messages}, config={"configurable": {"sampling_params": sampling_params}})
        return self.convert_agent_graph_output(state)


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else getattr(message, "type", None)
