"""Tools that agents call: a sandbox for model-written Python code, and agentscope's ``execute_python_code`` on it."""

from lit_agentrl.tools.execute import ToolResponse, execute_python_code, execute_python_code_sync, set_code_runner
from lit_agentrl.tools.sandbox import CodeRunner, PythonSandbox, SandboxLimits, SandboxResult

__all__ = [
    "CodeRunner",
    "PythonSandbox",
    "SandboxLimits",
    "SandboxResult",
    "ToolResponse",
    "execute_python_code",
    "execute_python_code_sync",
    "set_code_runner",
]
