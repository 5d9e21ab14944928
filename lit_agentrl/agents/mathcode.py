"""``mathcode_agent``: the model solves a math problem by writing Python, run in a sandbox, and answers in ``\\boxed{}``.

Graph: ``agent`` (model) -> [tool calls?] -> ``tools`` (runs each ``execute_python`` call's code) -> ``agent`` ... ;
it ends when the model calls no tool, after ``cfg.max_ai_message_turn`` model turns, or past
``cfg.max_total_token_length`` tokens. The tool's answer is what the code printed, or the error (traceback
tail, timeout, refused operation). The agent sets no ``reward_score``: the row's reward function (``math``)
scores the ``\\boxed{}`` answer in ``str_output``.

The code runs in a :class:`~lit_agentrl.tools.sandbox.PythonSandbox` built from ``cfg.sandbox`` (a mapping
of :class:`~lit_agentrl.tools.sandbox.SandboxLimits` fields), ``cfg.sandbox_site_packages`` and
``cfg.sandbox_python``; or in any :class:`~lit_agentrl.tools.sandbox.CodeRunner` (a remote sandbox
service's client), given as ``code_runner=`` or as ``cfg.code_runner: "package.module:factory"`` (called
with no arguments).

Where the machine cannot give the :class:`~lit_agentrl.tools.sandbox.PythonSandbox` its whole kernel boundary
(bubblewrap, user namespaces, seccomp, cgroups; ``isolation["missing"]`` names what is not there), building the
agent fails, unless the agent YAML sets ``allow_weak_sandbox: true``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool

from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.registry import register
from lit_agentrl.agents.tool_loop import ToolLoopAgentGraph, error_message
from lit_agentrl.errors import UserInputError
from lit_agentrl.tools.sandbox import CodeRunner, PythonSandbox, SandboxResult, SandboxUnavailable, limits_from_mapping

_default_runner: PythonSandbox | None = None

WEAK_SANDBOX_KEY = "allow_weak_sandbox"
"""The agent YAML key that accepts a sandbox without the whole kernel boundary (see docs/sandbox.md)."""


@tool
async def execute_python(code: str, **kwargs: Any) -> str:
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
class MathCodeAgentGraph(ToolLoopAgentGraph):
    """The seed's second example: the model writes code, a sandbox runs it, the model answers in ``\\boxed{}``."""

    tools: ClassVar[list[Any]] = [execute_python]
    default_max_turns = 4

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
        self.code_runner: CodeRunner = code_runner or _runner_from_cfg(cfg)
        if not callable(getattr(self.code_runner, "arun", None)):
            raise TypeError(f"code_runner must have `async def arun(code) -> SandboxResult`, got {self.code_runner!r}")

    async def run_tool(self, call: Mapping[str, Any], config: RunnableConfig) -> ToolMessage:
        code = call["args"].get("code") if isinstance(call["args"], dict) else None
        if not isinstance(code, str):
            return error_message(call, "execute_python needs one argument, `code`, a string of Python source")
        try:
            result: SandboxResult = await self.code_runner.arun(code)
        except Exception as exc:  # e.g. a remote runner's connection error: the trajectory goes on
            return error_message(call, f"{type(exc).__name__}: {exc}")
        status = "success" if result.error is None else "error"
        return ToolMessage(content=result.as_tool_text(), name=call["name"], tool_call_id=call["id"], status=status)


def _runner_from_cfg(cfg: Any) -> CodeRunner:
    """The agent YAML's ``code_runner`` factory, else a PythonSandbox from ``sandbox*`` keys."""
    target = cfg_get(cfg, "code_runner", None)
    if target:
        module_name, _, attr = str(target).partition(":")
        if not attr:
            raise ValueError(f"code_runner must be 'package.module:factory', got {target!r}")
        return getattr(importlib.import_module(module_name), attr)()
    try:
        return PythonSandbox(
            limits_from_mapping(cfg_get(cfg, "sandbox", None)),
            python=str(cfg_get(cfg, "sandbox_python", sys.executable)),
            site_packages=bool(cfg_get(cfg, "sandbox_site_packages", False)),
            allow_weak_sandbox=cfg_get(cfg, WEAK_SANDBOX_KEY, False) is True,
        )
    except SandboxUnavailable as exc:
        raise UserInputError(
            f"mathcode_agent: {exc}",
            hint=f"set `{WEAK_SANDBOX_KEY}: true` in the agent YAML to run with what this machine allows, install "
            "what is missing, or plug in a remote `code_runner` (see docs/sandbox.md)",
        ) from exc
