"""Images in a conversation: finding them, rendering them for a vision-language policy, and the model type.

Text models render messages with the tokenizer's chat template. A message carrying image content must never be
rendered that way: the template would drop the image, or print its URL or path as text, and the model would answer
a question it never saw. With a vision-language policy's processor, :func:`encode_multimodal` renders the messages
through the processor's chat template (each image part becomes the model's placeholder, e.g. Qwen's
``<|vision_start|><|image_pad|><|vision_end|>``), runs the image processor (``pixel_values``, ``image_grid_thw``)
and widens each placeholder to one token per merged patch, as the model's own processor does. Without a processor,
an image fails its trajectory with a clear error.

Image parts may be written in any of the usual layouts: ``{"type": "image", "image": X}`` (Qwen's),
``{"type": "image_url", "image_url": {"url": X}}`` (OpenAI chat), ``{"type": "input_image", "image_url": X}``
(OpenAI responses), LangChain's ``{"type": "image", "url"|"path"|"base64": X}``; X is a path, a ``file://`` or
``data:`` URL, bytes, a ``{"bytes"}``/``{"path"}`` dict or a PIL image (:func:`lit_agentrl.models.processors.load_image`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from langchain_core.messages import convert_to_openai_messages

from lit_agentrl.models.processors import expand_image_pads, load_image

IMAGE_PART_TYPES = frozenset({"image", "image_url", "input_image"})
"""``type`` of a content part holding an image: LangChain's standard block, OpenAI chat, OpenAI responses."""

IMAGE_PLACEHOLDER = "<image>"
"""Where an image goes in a row's prompt text (Geometry3K's and the seed's rows): see :func:`attach_images`."""

MULTI_MODAL_FIELD = "multi_modal_inputs"
"""``{"pixel_values": [N, D], "image_grid_thw": [k, 3]}``: a conversation's images as the model takes them."""


def is_image_part(part: Any) -> bool:
    """Whether one content part of a message is an image: by its ``type``, or without one by a non-null ``image``/
    ``image_url``. (Parquet files written by ``datasets`` give every part every key, null where unused: a text
    part may carry ``"image_url": None``.)"""
    if not isinstance(part, Mapping):
        return False
    kind = part.get("type")
    if kind is not None:
        return kind in IMAGE_PART_TYPES
    return part.get("image") is not None or part.get("image_url") is not None


def _content(message: Any) -> Any:
    return message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)


def has_images(message: Any) -> bool:
    content = _content(message)
    return isinstance(content, list) and any(is_image_part(part) for part in content)


def first_image_message(messages: Sequence[Any]) -> int | None:
    """Index of the first message (LangChain message or dict) whose content has an image part, or None."""
    return next((index for index, message in enumerate(messages) if has_images(message)), None)


def image_source(part: Mapping[str, Any]) -> Any:
    """What an image part points at: a path, URL, bytes, dict or PIL image (see the module's layouts)."""
    for key in ("image", "image_url", "url", "path"):
        value = part.get(key)
        if isinstance(value, Mapping) and "url" in value:
            value = value["url"]
        if value is not None:
            return value
    if part.get("base64") or part.get("data"):
        data = part.get("base64") or part.get("data")
        return f"data:{part.get('mime_type', 'image/png')};base64,{data}"
    raise ValueError(f"an image part without its image: keys {sorted(part)}")


def template_messages(messages: Sequence[Any]) -> tuple[list[dict], list[Any]]:
    """OpenAI-style message dicts for the chat template, each image part as ``{"type": "image"}``, and the images'
    sources in order. Messages without images convert as LangChain converts them."""
    rendered: list[dict] = []
    sources: list[Any] = []
    for message in messages:
        if not has_images(message):
            rendered.extend(convert_to_openai_messages([message]))
            continue
        parts = []
        for part in _content(message):
            if is_image_part(part):
                sources.append(image_source(part))
                parts.append({"type": "image"})
            elif isinstance(part, str):
                parts.append({"type": "text", "text": part})
            else:  # without null keys, which a template testing `'image_url' in part` would take for an image
                parts.append({key: value for key, value in part.items() if value is not None})
        role = message.get("role") if isinstance(message, Mapping) else _ROLES.get(getattr(message, "type", ""), "user")
        rendered.append({"role": role, "content": parts})
    return rendered, sources


_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def openai_messages(messages: Sequence[Any]) -> list[dict]:
    """The conversation as OpenAI-style dicts for logs and the viewer; an image part keeps its path (or
    ``"<image>"`` when it is not a path), never its pixels."""
    rendered, sources = template_messages(messages)
    described = iter(_describe(s) for s in sources)
    for message in rendered:
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = [
                {"type": "image", "image": next(described)} if part == {"type": "image"} else part for part in content
            ]
    return rendered


def _describe(source: Any) -> str:
    if isinstance(source, str) and not source.startswith("data:"):
        return source
    if isinstance(source, Mapping) and isinstance(source.get("path"), str):
        return str(source["path"])
    return IMAGE_PLACEHOLDER


def attach_images(messages: Sequence[Any], images: Sequence[Any] | None) -> list[Any]:
    """The row's ``messages`` with its ``images`` put in as image parts (the seed's Geometry3K rows).

    Each ``<image>`` in a message's text becomes the next image, in order; images left over go before the text of
    the first user message. Messages are dicts (``{"role", "content"}``) or LangChain messages; they come back as
    dicts when they change.
    """
    pending = list(images or [])
    if not pending:
        return list(messages)
    out: list[Any] = []
    for message in messages:
        content = _content(message)
        if isinstance(content, str) and IMAGE_PLACEHOLDER in content and pending:
            pieces = content.split(IMAGE_PLACEHOLDER)
            parts: list[dict] = []
            for k, piece in enumerate(pieces):
                if k and pending:
                    parts.append({"type": "image", "image": pending.pop(0)})
                if piece.strip():
                    parts.append({"type": "text", "text": piece.strip() if k else piece.rstrip()})
            out.append({"role": _role(message), "content": parts})
        else:
            out.append(message)
    if pending:
        for index, message in enumerate(out):
            if _role(message) == "user":
                content = _content(message)
                text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
                images_first = [{"type": "image", "image": image} for image in pending]
                out[index] = {"role": "user", "content": images_first + text}
                break
        else:
            raise ValueError(f"{len(pending)} image(s) but no user message to put them in")
    return out


def _role(message: Any) -> str:
    if isinstance(message, Mapping):
        return str(message.get("role"))
    return _ROLES.get(getattr(message, "type", ""), "user")


# ------------------------------------------------------------------ rendering


@dataclass
class VisionInputs:
    """A conversation's images: as given (for the engine's ``image_data``) and as the model takes them."""

    images: list[Any] = field(default_factory=list)
    """PIL images, in order of appearance."""
    pixel_values: torch.Tensor | None = None
    """[N, D]: every image's patches, concatenated."""
    image_grid_thw: torch.Tensor | None = None
    """[k, 3]: each image's (t, h, w) patch grid."""

    def __add__(self, other: VisionInputs) -> VisionInputs:
        if not other.images:
            return self
        if not self.images:
            return other
        assert self.pixel_values is not None and other.pixel_values is not None
        assert self.image_grid_thw is not None and other.image_grid_thw is not None
        return VisionInputs(
            self.images + other.images,
            torch.cat([self.pixel_values, other.pixel_values]),
            torch.cat([self.image_grid_thw, other.image_grid_thw]),
        )

    def model_inputs(self) -> dict[str, torch.Tensor] | None:
        """``{"pixel_values", "image_grid_thw"}``, None without images."""
        if self.pixel_values is None or self.image_grid_thw is None:
            return None
        return {"pixel_values": self.pixel_values, "image_grid_thw": self.image_grid_thw}


def process_images(processor: Any, sources: Sequence[Any]) -> VisionInputs:
    """Load ``sources`` and run the processor's image processor on them."""
    if not sources:
        return VisionInputs()
    images = [load_image(s) for s in sources]
    out = processor.image_processor(images=images, return_tensors="pt")
    return VisionInputs(images, out["pixel_values"], out["image_grid_thw"].long())


def widen(processor: Any, text: str, vision: VisionInputs) -> str:
    """``text`` with each image placeholder widened to the image's merged patches (the processor's own rule)."""
    grids = [] if vision.image_grid_thw is None else vision.image_grid_thw.tolist()
    merge = int(getattr(processor.image_processor, "merge_size", 2))
    return expand_image_pads(text, grids, merge, image_token(processor))


def image_token(processor: Any) -> str:
    return getattr(processor, "image_token", None) or "<|image_pad|>"


def require_processor(agent_name: str, processor: Any, messages: Sequence[Any]) -> None:
    """Raise when images reach a chat model without a processor (a text policy): they would be dropped."""
    if processor is None:
        index = first_image_message(messages)
        raise ValueError(
            f"agent {agent_name!r}: message {index} of the conversation carries image content, but the chat model "
            "has no processor (the policy is a text model), so the image would be dropped: train a "
            "vision-language policy, or remove the image parts from this agent's messages"
        )


def encode_multimodal(
    agent_name: str,
    processor: Any,
    messages: Sequence[Any],
    tools: list[dict] | None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[int], VisionInputs]:
    """The prompt ids of a first turn with images (the processor's chat template, generation prompt added, each
    placeholder widened) and its images. ``ValueError`` without a processor."""
    require_processor(agent_name, processor, messages)
    rendered, sources = template_messages(messages)
    vision = process_images(processor, sources)
    text = processor.apply_chat_template(
        rendered, tools=tools, tokenize=False, add_generation_prompt=True, **dict(chat_template_kwargs or {})
    )
    return tokenizer_of(processor).encode(widen(processor, text, vision), add_special_tokens=False), vision


def tokenizer_of(processor: Any) -> Any:
    return getattr(processor, "tokenizer", processor)
