"""``mathcode_agent``: the model solves a math problem by writing Python, run in a sandbox, and answers in ``\\boxed{}``.

Graph: ``agent`` (model) -> [tool calls?] -> ``tools`` (runs each ``python_exec`` call's code) -> ``agent`` ... ;
it ends when the model calls no tool, after ``cfg.max_ai_message_turn`` model turns, or past
``cfg.max_total_token_length`` tokens. The tool's answer is what the code printed, or the error (traceback
tail, timeout, refused operation). The agent sets no ``reward_score``: the row's reward function (``math``)
scores the ``\\boxed{}`` answer in ``str_output``.

The code runs in a :class:`~lit_agentrl.tools.sandbox.PythonSandbox` built from ``cfg.sandbox`` (a mapping
of :class:`~lit_agentrl.tools.sandbox.SandboxLimits` fields), ``cfg.sandbox_site_packages`` and
``cfg.sandbox_python``; or in any :class:`~lit_agentrl.tools.sandbox.CodeRunner` (a remote sandbox
service's client), given as ``code_runner=`` or as ``cfg.code_runner: "package.module:factory"`` (called
with no arguments).
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from typing import Annotated, Any, Sequence, TypedDict

from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents.base import AgentGraph, AgentGraphOutput
from lit_agentrl.agents.chat_model import ChatModel, find_last_ai_index
from lit_agentrl.agents.matheval import _cfg_get
from lit_agentrl.agents.registry import register
from lit_agentrl.tools.sandbox import CodeRunner, PythonSandbox, SandboxResult, limits_from_mapping

DEFAULT_MAX_AI_MESSAGE_TURN = 4
DEFAULT_MAX_TOTAL_TOKEN_LENGTH = 4096

_default_runner: PythonSandbox | None = None


class MathCodeState(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]


@tool
async def python_exec(code: str, **kwargs: Any) -> str:
    """Run Python code and return what it prints (stdout), or the error.

    Use print() to see values. Each call starts a fresh interpreter with the standard library: nothing
    persists between calls, there is no network, and files can only be written in the current directory.
    """
    global _default_runner
    runner = kwargs.get("runner")
    if runner is None:  # called on its own, outside the agent
        _default_runner = _default_runner or PythonSandbox()
        runner = _default_runner
    return (await runner.arun(code)).as_tool_text()


@register("mathcode_agent")
class MathCodeAgentGraph(AgentGraph):
    """The seed's second example: the model writes code, a sandbox runs it, the model answers in ``\\boxed{}``."""

    tools = [python_exec]

    def __init__(
        self,
        agent_name: str,
        cfg: Any,
        llm: Any,
        tokenizer: Any,
        processor: Any = None,
        code_runner: CodeRunner | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(agent_name, cfg, llm, tokenizer, processor, **kwargs)
        self.max_turns = int(_cfg_get(cfg, "max_ai_message_turn", DEFAULT_MAX_AI_MESSAGE_TURN))
        self.max_tokens = int(_cfg_get(cfg, "max_total_token_length", DEFAULT_MAX_TOTAL_TOKEN_LENGTH))
        self.code_runner: CodeRunner = code_runner or _runner_from_cfg(cfg)
        if not callable(getattr(self.code_runner, "arun", None)):
            raise TypeError(f"code_runner must have `async def arun(code) -> SandboxResult`, got {self.code_runner!r}")
        self.build_graph()

    def build_graph(self) -> Any:
        self.tools_by_name = {t.name: t for t in self.tools}
        self.chatmodel = ChatModel(model=self.agent_name, llm=self.llm, tokenizer=self.tokenizer).bind_tools(self.tools)
        workflow = StateGraph(MathCodeState)
        workflow.add_node("agent", self._call_model)
        workflow.add_node("tools", self._call_tools)
        workflow.set_entry_point("agent")
        workflow.add_conditional_edges("agent", self._should_continue, {"continue": "tools", "end": END})
        workflow.add_edge("tools", "agent")
        self.graph = workflow.compile()
        return self.graph

    async def _call_model(self, state: MathCodeState, config: RunnableConfig) -> dict:
        params = config["configurable"]["sampling_params"]
        return {"messages": [await self.chatmodel.ainvoke(state["messages"], sampling_params=params)]}

    async def _call_tools(self, state: MathCodeState, config: RunnableConfig) -> dict:
        last = state["messages"][-1]
        results = list(await asyncio.gather(*(self._run_tool(call) for call in last.tool_calls)))
        results += [
            ToolMessage(content=f"Error: {bad['error']}", tool_call_id=bad["id"] or "invalid", status="error")
            for bad in last.invalid_tool_calls
        ]
        return {"messages": results}

    async def _run_tool(self, call: dict) -> ToolMessage:
        name, args = call["name"], call["args"]
        if name not in self.tools_by_name:
            return ToolMessage(content=f"Error: unknown tool {name!r}", tool_call_id=call["id"], status="error")
        code = args.get("code") if isinstance(args, dict) else None
        if not isinstance(code, str):
            return ToolMessage(
                content="Error: python_exec needs one argument, `code`, a string of Python source",
                name=name, tool_call_id=call["id"], status="error",
            )
        try:
            result: SandboxResult = await self.code_runner.arun(code)
            content, status = result.as_tool_text(), ("success" if result.error is None else "error")
        except Exception as exc:  # e.g. a remote runner's connection error: the trajectory goes on
            content, status = f"Error: {type(exc).__name__}: {exc}", "error"
        return ToolMessage(content=content, name=name, tool_call_id=call["id"], status=status)

    def _should_continue(self, state: MathCodeState) -> str:
        messages = state["messages"]
        last = messages[-1]
        model_turns = sum(1 for m in messages if m.type == "ai")
        total_tokens = len(last.response_metadata["token_ids"])
        if not (last.tool_calls or last.invalid_tool_calls):
            return "end"
        if model_turns >= self.max_turns or total_tokens >= self.max_tokens:
            return "end"
        return "continue"

    async def run(self, messages: Sequence[Any], sampling_params: dict[str, Any], **kwargs: Any) -> AgentGraphOutput:
        config = {"configurable": {"sampling_params": sampling_params}}
        state = await self.graph.ainvoke({"messages": list(messages)}, config=config)
        output = self.convert_agent_graph_output(state)
        kept = state["messages"][: find_last_ai_index(state["messages"]) + 1]
        output.extra_fields["num_tool_errors"] = sum(
            1 for m in kept if isinstance(m, ToolMessage) and getattr(m, "status", None) == "error"
        )
        return output


def _runner_from_cfg(cfg: Any) -> CodeRunner:
    """The agent YAML's ``code_runner`` factory, else a PythonSandbox from ``sandbox*`` keys."""
    target = _cfg_get(cfg, "code_runner", None)
    if target:
        module_name, _, attr = str(target).partition(":")
        if not attr:
            raise ValueError(f"code_runner must be 'package.module:factory', got {target!r}")
        return getattr(importlib.import_module(module_name), attr)()
    return PythonSandbox(
        limits_from_mapping(_cfg_get(cfg, "sandbox", None)),
        python=str(_cfg_get(cfg, "sandbox_python", sys.executable)),
        site_packages=bool(_cfg_get(cfg, "sandbox_site_packages", False)),
    )
