"""Tools that agents call: a sandbox for model-written Python code."""

from lit_agentrl.tools.sandbox import CodeRunner, PythonSandbox, SandboxLimits, SandboxResult

__all__ = ["CodeRunner", "PythonSandbox", "SandboxLimits", "SandboxResult"]
