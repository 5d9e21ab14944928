"""A policy checkpoint's model class, and the model built from its config alone (shapes, no weights).

The engines read it to check the names and shapes of a weight push, the planner and the CLI to count and select
parameters, the trainer to shard the policy before filling it: none of them needs the weights.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, PreTrainedModel

from lit_agentrl.models.processors import is_vision_language

__all__ = ["empty_model", "model_class"]


def model_class(path: str) -> Any:
    """``AutoModelForImageTextToText`` for a vision-language model (its vision tower is trained and synced too),
    else ``AutoModelForCausalLM``."""
    return AutoModelForImageTextToText if is_vision_language(path) else AutoModelForCausalLM


def empty_model(path: str) -> PreTrainedModel:
    """The model at ``path`` built from its config on the meta device: shapes only, no memory, no weights read."""
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model.model_path={path!r}: no loadable causal LM there ({exc})") from exc
    with torch.device("meta"):
        return model_class(path).from_config(config, dtype=torch.float32)
