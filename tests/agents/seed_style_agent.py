"""A test agent written the way the seed framework's examples are written.

Nested node functions reading the chat model and sampling params from ``config["configurable"]``, a
``@tool`` with ``**kwargs`` that the schema hides, ``cfg.xxx`` from the agent YAML, ``run(messages,
sampling_params, **kwargs)`` receiving the row's extra fields, and ``convert_agent_graph_output`` in an
executor. Only the ``lit_agentrl`` import lines would differ in the seed's framework.
"""

import ast
import asyncio
import operator
from typing import Annotated, Any, Sequence, TypedDict  # noqa: UP035  (the seed's own import line)

from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents import AgentGraphOutput, BaseAgentGraph, CustomChatModel, register
from lit_agentrl.rewards.math import is_equiv

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("only + - * / on numbers")


class CalcState(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]


@register("calculator_agent")
class CalculatorAgentGraph(BaseAgentGraph):
    def __init__(self, agent_name, cfg, llm, tokenizer, **kwargs):
        super().__init__(agent_name, cfg, llm, tokenizer, **kwargs)
        self.build_graph()

    def build_graph(self):
        self.chatmodel = CustomChatModel(model=self.agent_name, llm=self.llm, tokenizer=self.tokenizer)

        @tool
        def calculate(expression: str, **kwargs):
            """Evaluate an arithmetic expression with + - * /."""
            return str(_evaluate(ast.parse(expression, mode="eval").body))

        tools_by_name = {calculate.name: calculate}

        async def call_model(state: CalcState, config: RunnableConfig):
            chatmodel = config["configurable"]["chat_model"]
            message = await chatmodel.ainvoke(
                state["messages"], sampling_params=config["configurable"]["sampling_params"]
            )
            return {"messages": [message]}

        async def tool_node(state: CalcState, config: RunnableConfig):
            outputs = []
            for call in state["messages"][-1].tool_calls:
                try:
                    result = tools_by_name[call["name"]].func(**call["args"])
                except Exception as exc:
                    result = f"error: {exc}"
                outputs.append(ToolMessage(content=result, name=call["name"], tool_call_id=call["id"]))
            return {"messages": outputs}

        def should_continue(state: CalcState):
            turns = sum(1 for m in state["messages"] if m.type == "ai")
            if not state["messages"][-1].tool_calls or turns >= self.cfg.max_turns:
                return "end"
            return "continue"

        self.chatmodel = self.chatmodel.bind_tools([calculate])
        workflow = StateGraph(CalcState)
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
        # The agent scores itself; the row's extra field `unit` travels in through **kwargs.
        answer = output.str_output.rsplit("\\boxed{", 1)[-1].split("}", 1)[0]
        output.reward_score = 1.0 if is_equiv(answer, kwargs["ground_truth"]) else 0.0
        output.extra_fields["unit"] = kwargs.get("unit")
        return output
