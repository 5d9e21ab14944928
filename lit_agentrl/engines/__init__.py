"""Rollout engines behind SGLang's ``Engine`` API; :func:`build_engine` picks one by name."""

from __future__ import annotations

from typing import Any

from lit_agentrl.engines.base import GenerateResult, RolloutEngine, output_logprobs
from lit_agentrl.engines.sampling import SamplingParams

ENGINES = ("transformers", "sglang")


def build_engine(name: str, model_path: str, seed: int = 0, **kwargs: Any) -> RolloutEngine:
    """Construct the engine ``name`` over the model at ``model_path``; ``kwargs`` go to its constructor."""
    if name == "transformers":
        from lit_agentrl.engines.hf import TransformersEngine

        return TransformersEngine(model_path, seed=seed, **kwargs)
    if name == "sglang":
        raise NotImplementedError(
            "rollout.engine='sglang' is not available yet in this release; use engine='transformers'"
        )
    raise ValueError(f"unknown rollout engine {name!r}; choose one of {list(ENGINES)}")


__all__ = ["ENGINES", "GenerateResult", "RolloutEngine", "SamplingParams", "build_engine", "output_logprobs"]
