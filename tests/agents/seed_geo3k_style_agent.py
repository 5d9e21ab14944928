"""A vision-language agent written the way the seed's ``geo3k_agent_graph.py`` is, for the compatibility tests.

Our own code in that style (not a copy): a LangGraph graph whose model node calls a ``CustomChatModel`` built with the
graph's ``processor`` and ``model_type``; ``run`` puts the row's ``images`` where the problem text says ``<image>``
and scores the answer with Geometry3K's ``acc_reward``. Only the import lines differ from the seed's framework.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents import AgentGraphOutput, BaseAgentGraph, CustomChatModel, register
from lit_agentrl.rewards.geo3k import acc_reward


class GeoState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


@register("seed_geo3k_style")
class SeedGeo3kStyleAgent(BaseAgentGraph):
    def __init__(self, agent_name, cfg, llm, tokenizer, processor=None, **kwargs):
        super().__init__(agent_name, cfg, llm, tokenizer, processor, **kwargs)
        self.build_graph()

    def build_graph(self):
        self.chatmodel = CustomChatModel(
            model=self.agent_name,
            llm=self.llm,
            tokenizer=self.tokenizer,
            processor=self.processor,
            model_type=self.model_type,
        )

        async def call_model(state: GeoState, config: RunnableConfig):
            sampling_params = config["configurable"]["sampling_params"]
            response = await self.chatmodel.ainvoke(state["messages"], sampling_params=sampling_params)
            return {"messages": [response]}

        workflow = StateGraph(GeoState)
        workflow.add_node("agent", call_model)
        workflow.set_entry_point("agent")
        workflow.add_edge("agent", END)
        self.graph = workflow.compile()

    @staticmethod
    def _with_images(messages, images):
        converted = []
        pending = list(images or [])
        for message in messages:
            if message["role"] == "user" and "<image>" in message["content"] and pending:
                content: list[dict[str, Any]] = []
                for k, text in enumerate(message["content"].split("<image>")):
                    if k and pending:
                        content.append({"type": "image", "image": pending.pop(0)})
                    if text:
                        content.append({"type": "text", "text": text})
                converted.append(HumanMessage(content=content))
            else:
                converted.append(message)
        return converted

    async def run(self, messages, sampling_params: dict[str, Any], **kwargs) -> AgentGraphOutput:
        state = await self.graph.ainvoke(
            {"messages": self._with_images(messages, kwargs.get("images"))},
            config={"configurable": {"sampling_params": sampling_params}},
        )
        output = self.convert_agent_graph_output(state)
        output.reward_score = acc_reward(output.str_output, kwargs["ground_truth"])
        return output
