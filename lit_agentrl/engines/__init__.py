"""Rollout engines behind SGLang's ``Engine`` API, chosen by their registered name (:func:`build_engines`)."""

from __future__ import annotations

from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.engines.base import (
    EngineWrapper,
    GenerateResult,
    PromptTooLongError,
    RolloutEngine,
    output_logprobs,
)
from lit_agentrl.engines.registry import build_engines, get_engine_class, register_engine, registered_engines

__all__ = [
    "EngineWrapper",
    "GenerateResult",
    "PromptTooLongError",
    "RolloutEngine",
    "SamplingParams",
    "build_engines",
    "get_engine_class",
    "output_logprobs",
    "register_engine",
    "registered_engines",
]
