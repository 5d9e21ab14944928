"""Images in a conversation: finding them, the model type of a vision-language policy, and the rendering hook.

Text models render messages with the tokenizer's chat template. A message carrying image content must never be
rendered that way: the template would drop the image, or print its URL or path as text, and the model would answer
a question it never saw. :func:`encode_multimodal` is where a vision-language model's prompt rendering plugs in
(processor: chat template with image placeholders, ``pixel_values`` and ``image_grid_thw``); until it does, any
image reaching a :class:`~lit_agentrl.agents.ChatModel` fails that trajectory with a clear error.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

IMAGE_PART_TYPES = frozenset({"image", "image_url", "input_image"})
"""``type`` of a content part holding an image: LangChain's standard block, OpenAI chat, OpenAI responses."""


def is_image_part(part: Any) -> bool:
    """Whether one content part of a message is an image (by its ``type``, or an ``image``/``image_url`` key)."""
    if not isinstance(part, Mapping):
        return False
    return part.get("type") in IMAGE_PART_TYPES or "image" in part or "image_url" in part


def first_image_message(messages: Sequence[Any]) -> int | None:
    """Index of the first message (LangChain message or dict) whose content has an image part, or None."""
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
        if isinstance(content, list) and any(is_image_part(part) for part in content):
            return index
    return None


def encode_multimodal(
    agent_name: str, processor: Any, messages: Sequence[Any], tools: list[dict] | None
) -> tuple[list[int], list[int], list[float], int]:
    """The engine input for a conversation with images: ``(token_ids, loss_mask, logprobs, prompt_length)``.

    The hook for vision-language rendering (not implemented yet): it raises, naming the agent and the message, so
    an image is never dropped silently. Without a processor (a text policy) the error says so.
    """
    index = first_image_message(messages)
    if processor is None:
        raise ValueError(
            f"agent {agent_name!r}: message {index} of the conversation carries image content, but the chat model "
            "has no processor (the policy is a text model), so the image would be dropped: train a "
            "vision-language policy, or remove the image parts from this agent's messages"
        )
    raise NotImplementedError(
        f"agent {agent_name!r}: message {index} carries image content; rendering images for a vision-language "
        "policy is not implemented yet (lit_agentrl.agents.multimodal.encode_multimodal)"
    )


def infer_model_type(processor: Any, tokenizer: Any) -> str | None:
    """The policy's Hugging Face ``model_type`` (e.g. ``"qwen2_5_vl"``, ``"qwen3"``) from the ``config.json`` of
    the folder the processor or tokenizer was loaded from; None when that is not a local model folder."""
    for component in (processor, getattr(processor, "tokenizer", None), tokenizer):
        folder = getattr(component, "name_or_path", None)
        if isinstance(folder, str) and folder:
            found = _config_model_type(folder)
            if found is not None:
                return found
    return None


@functools.lru_cache(maxsize=32)
def _config_model_type(folder: str) -> str | None:
    """``model_type`` of ``folder/config.json`` (cached: every agent graph built over the policy asks)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return model_type if isinstance(model_type, str) else None
