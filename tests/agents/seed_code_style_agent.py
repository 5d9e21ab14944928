"""A test agent written the way the seed framework's math-code example is written.

The model writes Python, a LangGraph tool node runs it with agentscope's ``execute_python_code`` (awaited, its
``ToolResponse`` content blocks turned into the tool message), and the model answers in ``\\boxed{}``. Only the
``lit_agentrl`` import lines would differ in the seed's framework: ``execute_python_code`` comes from
``lit_agentrl.tools`` (our sandbox) instead of ``agentscope.tool``.
"""

import asyncio
from typing import Annotated, Any, Sequence, TypedDict  # noqa: UP035  (the seed's own import line)

from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents import AgentGraphOutput, BaseAgentGraph, CustomChatModel, register
from lit_agentrl.rewards.math import is_equiv
from lit_agentrl.tools import execute_python_code


class CodeState(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]


@register("seed_style_code_agent")
class CodeAgentGraph(BaseAgentGraph):
    def __init__(self, agent_name, cfg, llm, tokenizer, **kwargs):
        super().__init__(agent_name, cfg, llm, tokenizer, **kwargs)
        self.build_graph()

    def build_graph(self):
        self.chatmodel = CustomChatModel(
            model=self.agent_name, llm=self.llm, tokenizer=self.tokenizer, processor=self.processor
        )

        @tool
        async def python(code: str, **kwargs):
            """Run Python code and return what it printed."""
            response = await execute_python_code(code, timeout=10)
            return "".join(block["text"] for block in response.content)

        async def call_model(state: CodeState, config: RunnableConfig):
            chatmodel = config["configurable"]["chat_model"]
            message = await chatmodel.ainvoke(
                state["messages"], sampling_params=config["configurable"]["sampling_params"]
            )
            return {"messages": [message]}

        async def tool_node(state: CodeState, config: RunnableConfig):
            outputs = []
            for call in state["messages"][-1].tool_calls:
                try:
                    result = await python.coroutine(**call["args"])
                except Exception:  # the seed's examples answer any tool error so
                    result = "tool execute error"
                outputs.append(ToolMessage(content=result, name=call["name"], tool_call_id=call["id"]))
            return {"messages": outputs}

        def should_continue(state: CodeState):
            turns = sum(1 for m in state["messages"] if m.type == "ai")
            return "continue" if state["messages"][-1].tool_calls and turns < 3 else "end"

        self.chatmodel = self.chatmodel.bind_tools([python])
        workflow = StateGraph(CodeState)
        workflow.add_node("agent", call_model)
        workflow.add_node("tools", tool_node)
        workflow.set_entry_point("agent")
        workflow.add_conditional_edges("agent", should_continue, {"continue": "tools", "end": END})
        workflow.add_edge("tools", "agent")
        self.graph = workflow.compile()

    async def run(self, messages, sampling_params: dict[str, Any], **kwargs) -> AgentGraphOutput:
        config = {"configurable": {"chat_model": self.chatmodel, "sampling_params": sampling_params}}
        state = await self.graph.ainvoke(input={"messages": messages}, config=config)
        loop = asyncio.get_running_loop()
        output = await loop.run_in_executor(None, lambda: self.convert_agent_graph_output(state))
        answer = output.str_output.rsplit("\\boxed{", 1)[-1].split("}", 1)[0]
        output.reward_score = 1.0 if is_equiv(answer, kwargs["ground_truth"]) else 0.0
        return output
