"""Dataset rows as agents see them: where the prompt and the ground truth live in a row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PROMPT_KEYS = ("prompt", "messages")
"""A row's chat prompt is under the first of these keys present."""


def row_prompt(row: Mapping[str, Any]) -> Any:
    """The row's chat prompt (a list of ``{"role", "content"}`` messages); ``KeyError`` if it has none."""
    for key in PROMPT_KEYS:
        if key in row:
            return row[key]
    raise KeyError(f"row has no prompt: expected one of the fields {list(PROMPT_KEYS)}, got {sorted(row)}")


def row_ground_truth(row: Mapping[str, Any]) -> Any:
    """``reward_model.ground_truth`` (the seed's layout) or a top-level ``ground_truth``; None if absent."""
    reward_model = row.get("reward_model")
    if isinstance(reward_model, Mapping) and "ground_truth" in reward_model:
        return reward_model["ground_truth"]
    return row.get("ground_truth")


def agent_run_kwargs(row: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``AgentGraph.run`` for a row: every field, the prompt as ``messages``, plus ``ground_truth``."""
    kwargs = {k: v for k, v in row.items() if k not in PROMPT_KEYS}
    kwargs["messages"] = row_prompt(row)
    kwargs["ground_truth"] = row_ground_truth(row)
    return kwargs
