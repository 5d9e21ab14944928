"""A vision-language agent written the way the seed's ``geo3k_agent_graph.py`` is, for the compatibility tests.

Our own code in that style (not a copy): the constructor puts the YAML's ``chat_template`` on the graph's
``processor`` and ``tokenizer``; a LangGraph loop of a model node (a ``CustomChatModel`` built with ``processor=`` and
``model_type=``, read back from ``config["configurable"]["chat_model"]``) and a tool node running an answer-checking
``@tool`` with the row's ground truth in an executor thread (``acc_reward(answer, ground_truth, use_boxed=False)``);
it stops on a turn without tool calls, after ``cfg.max_ai_message_turn`` model turns or once the ``loss_mask`` reaches
``cfg.max_total_token_length``; ``run`` converts the final state in an executor thread. The rows carry the figures as
``image_url`` parts of their messages, as the seed's preprocessing writes them. Only the import lines differ from the
seed's framework.
"""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents import AgentGraphOutput, BaseAgentGraph, CustomChatModel, register
from lit_agentrl.rewards.geo3k import acc_reward


class GeoState(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]


@register("seed_geo3k_style")
class SeedGeo3kStyleAgent(BaseAgentGraph):
    def __init__(self, agent_name, cfg, llm, tokenizer, processor, **kwargs):
        super().__init__(agent_name, cfg, llm, tokenizer, processor, **kwargs)
        self.processor.chat_template = cfg.chat_template
        self.tokenizer.chat_template = cfg.chat_template
        self.build_graph()

    def build_graph(self):
        self.chatmodel = CustomChatModel(
            model=self.agent_name,
            llm=self.llm,
            tokenizer=self.tokenizer,
            processor=self.processor,
            model_type=self.model_type,
        )

        async def model_node(state: GeoState, config: RunnableConfig):
            model = config["configurable"]["chat_model"]
            reply = await model.ainvoke(state["messages"], sampling_params=config["configurable"]["sampling_params"])
            return {"messages": [reply]}

        @tool
        def check_answer(answer: str, **kwargs):
            """Tell whether an answer to the geometry problem is right."""
            return "Right." if acc_reward(answer, kwargs["ground_truth"], use_boxed=False) else "Wrong."

        checks = {check_answer.name: check_answer}

        async def tool_node(state: GeoState, config: RunnableConfig):
            replies = []
            for call in state["messages"][-1].tool_calls:
                args = copy.deepcopy(call["args"])
                args["ground_truth"] = config["configurable"]["ground_truth"]
                try:
                    check = functools.partial(checks[call["name"]].func, **args)
                    result = await asyncio.get_running_loop().run_in_executor(None, check)
                except Exception:
                    result = "tool execute error"
                replies.append(ToolMessage(content=result, name=call["name"], tool_call_id=call["id"]))
            return {"messages": replies}

        def route(state: GeoState):
            last = state["messages"][-1]
            model_turns = [m for m in state["messages"] if m.type == "ai"]
            tokens = len(model_turns[-1].response_metadata["loss_mask"])
            done = len(model_turns) >= self.cfg.max_ai_message_turn or tokens >= self.cfg.max_total_token_length
            return "end" if not last.tool_calls or done else "continue"

        self.chatmodel = self.chatmodel.bind_tools([check_answer])
        workflow = StateGraph(GeoState)
        workflow.add_node("agent", model_node)
        workflow.add_node("tools", tool_node)
        workflow.set_entry_point("agent")
        workflow.add_conditional_edges("agent", route, {"continue": "tools", "end": END})
        workflow.add_edge("tools", "agent")
        self.graph = workflow.compile()

    async def run(self, messages, sampling_params: dict[str, Any], **kwargs) -> AgentGraphOutput:
        config = {
            "configurable": {
                "chat_model": self.chatmodel,
                "sampling_params": sampling_params,
                "ground_truth": kwargs["ground_truth"],
            }
        }
        state = await self.graph.ainvoke(input={"messages": messages}, config=config)
        return await asyncio.get_running_loop().run_in_executor(None, lambda: self.convert_agent_graph_output(state))
