"""lit-agentrl: agentic reinforcement learning (GRPO) for language models in PyTorch Lightning."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

__version__ = "0.1.0"

MOVED = {
    **{f"lit_agentrl.{name}": f"lit_agentrl.training.{name}" for name in (
        "module", "objective", "losses", "logprobs", "correction", "batching", "loading", "checkpoint", "evaluation",
    )},
    "lit_agentrl.offload": "lit_agentrl.bridge.offload",
    "lit_agentrl.metrics": "lit_agentrl.rollout.metrics",
    "lit_agentrl.processors": "lit_agentrl.models.processors",
    "lit_agentrl.dtypes": "lit_agentrl.models.dtypes",
    "lit_agentrl.prompt_tokens": "lit_agentrl.data.prompt_tokens",
    "lit_agentrl.callbacks.colocation": "lit_agentrl.rollout.colocation",
    **{f"lit_agentrl.gateway{part}": f"lit_agentrl.agents.gateway{part}" for part in (
        "", ".server", ".session", ".request", ".responses",
    )},
    "lit_agentrl.training.offload": "lit_agentrl.bridge.offload",
    "lit_agentrl.engines.weight_sync": "lit_agentrl.bridge.weights",
}  # fmt: skip
"""Modules that moved when the package was grouped by concern: importing the old name (a config's ``class_path``
too) fails naming the new one."""


class _MovedModules(importlib.abc.MetaPathFinder):
    """Consulted after every other finder, so only for names no file answers any more."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname in MOVED:
            raise ModuleNotFoundError(f"{fullname} has moved to {MOVED[fullname]}: import it from there", name=fullname)
        return None


sys.meta_path.append(_MovedModules())
