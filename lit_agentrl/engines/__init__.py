"""Rollout engines behind SGLang's ``Engine`` API; :func:`build_engines` picks them by name."""

from __future__ import annotations

from typing import Any

from lit_agentrl.engines.base import GenerateResult, RolloutEngine, output_logprobs
from lit_agentrl.engines.sampling import SamplingParams

ENGINES = ("transformers", "sglang", "sglang_http")


def build_engines(name: str, model_path: str, seed: int = 0, **kwargs: Any) -> list[RolloutEngine]:
    """The engines called ``name`` over the model at ``model_path``; ``kwargs`` go to their constructors.

    ``transformers`` and ``sglang`` give one in-process engine; ``sglang_http`` gives one client per entry
    of ``urls`` (already running servers, balanced by the rollout manager).
    """
    if name == "transformers":
        from lit_agentrl.engines.hf import TransformersEngine

        return [TransformersEngine(model_path, seed=seed, **kwargs)]
    if name == "sglang":
        from lit_agentrl.engines.sglang import SGLangEngine

        return [SGLangEngine(model_path, seed=seed, **kwargs)]
    if name == "sglang_http":
        from lit_agentrl.engines.sglang import SGLangHTTPEngine

        urls = kwargs.pop("urls", None)
        if not urls:
            raise ValueError("engine 'sglang_http' needs engine_kwargs.urls: a list of SGLang server URLs")
        return [SGLangHTTPEngine(url, model_path, **kwargs) for url in urls]
    raise ValueError(f"unknown rollout engine {name!r}; choose one of {list(ENGINES)}")


__all__ = ["ENGINES", "GenerateResult", "RolloutEngine", "SamplingParams", "build_engines", "output_logprobs"]
