"""What the built-in chat agents share: a graph state holding the conversation and the node that calls the model.

:class:`ChatAgentGraph` is the base of ``single_turn`` and of the tool-loop agents (``matheval_agent``,
``mathcode_agent``): it builds its graph when constructed, starts the graph with the model node
:data:`MODEL_NODE` (:meth:`ChatAgentGraph.call_model`), and runs it with the sampling parameters and the chat model
in ``config["configurable"]`` (the keys the seed's graphs read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph

from lit_agentrl.agents.base import AgentGraph

MODEL_NODE = "agent"
"""The name of the node that calls the model (the seed's examples name it so)."""


class ChatState(TypedDict):
    """The graph state of a chat agent: the conversation, which each node extends with the messages it returns."""

    messages: Annotated[Sequence[BaseMessage], add_messages]


class ChatAgentGraph(AgentGraph):
    """An agent whose graph state is a :class:`ChatState` and whose graph starts with the model node.

    Subclasses implement :meth:`build_graph` (usually: ``self.chatmodel = self.make_chat_model()``, then
    :meth:`chat_workflow` plus their own nodes and edges, compiled into ``self.graph``) and ``run``, which
    calls :meth:`invoke_graph`. The constructor's arguments are :class:`AgentGraph`'s (``processor``: kept for the
    seed's signature and for vision-language agents; None for text models).
    """

    graph: CompiledStateGraph[ChatState, None, ChatState, ChatState]
    """The compiled workflow, set by :meth:`build_graph`."""

    def __init__(
        self, agent_name: str, cfg: Any, llm: Any, tokenizer: Any, processor: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(agent_name, cfg, llm, tokenizer, processor, **kwargs)
        self.build_graph()

    def chat_workflow(self) -> StateGraph[ChatState, None, ChatState, ChatState]:
        """A new :class:`ChatState` workflow holding the model node :data:`MODEL_NODE`, its entry point."""
        workflow = StateGraph(ChatState)
        workflow.add_node(MODEL_NODE, self.call_model)
        workflow.set_entry_point(MODEL_NODE)
        return workflow

    async def call_model(self, state: ChatState, config: RunnableConfig) -> dict[str, list[AIMessage]]:
        """The model node: one model turn on the conversation, with ``config["configurable"]["sampling_params"]``."""
        params = config["configurable"]["sampling_params"]
        return {"messages": [await self.chatmodel.ainvoke(state["messages"], sampling_params=params)]}

    async def invoke_graph(
        self, messages: Sequence[Any], sampling_params: Mapping[str, Any], **configurable: Any
    ) -> dict[str, Any]:
        """Run ``self.graph`` on ``messages``; the nodes find ``sampling_params``, ``chat_model`` (``self.chatmodel``)
        and ``configurable`` in ``config["configurable"]``. Returns the final state (``{"messages": [...]}``)."""
        base = {"chat_model": self.chatmodel, "sampling_params": sampling_params}
        config: RunnableConfig = {"configurable": {**base, **configurable}}
        state: dict[str, Any] = await self.graph.ainvoke({"messages": list(messages)}, config=config)
        return state
