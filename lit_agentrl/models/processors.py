"""The policy's tokenizer and, for a vision-language policy, its processor, its images, and its M-RoPE positions.

:func:`load_tokenizer` and :func:`load_policy_processor` load them with errors naming ``model.model_path``.

:func:`load_processor` loads what ``AutoProcessor`` would: for Qwen2.5-VL the chat template, the tokenizer and the
image processor. transformers' Qwen2.5-VL processor always builds a video processor, which needs torchvision; where
that is missing, the image processor (``AutoImageProcessor``) and the tokenizer are composed into a
:class:`ComposedVLProcessor` that renders and encodes images exactly as the Qwen2.5-VL processor does: each
``<|image_pad|>`` widened to one token per merged patch (``grid_t * grid_h * grid_w // merge_size**2``).

:func:`load_image` reads the images rows carry (paths, ``file://`` and ``data:`` URLs, bytes, ``{"bytes"}``/
``{"path"}`` dicts as ``data/prepare_geo3k.py`` and Hugging Face datasets write them, PIL images).
:func:`mrope_position_ids` gives a Qwen2-VL-family model's 3-D rotary positions for one token sequence with images.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

IMAGE_PAD = "<|image_pad|>"
"""Qwen's image placeholder token: the chat template writes one per image, widened to one per merged patch."""


def model_config(model_path: str) -> dict[str, Any]:
    """``model_path/config.json`` as a dict (empty when there is none or it does not parse)."""
    return dict(_config(str(model_path)))


@functools.lru_cache(maxsize=32)
def _config(folder: str) -> tuple[tuple[str, Any], ...]:
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    return tuple(config.items()) if isinstance(config, dict) else ()


def is_vision_language(model_path: str) -> bool:
    """Whether the model at ``model_path`` has a vision tower (its config has a ``vision_config``)."""
    return "vision_config" in model_config(model_path)


class ComposedVLProcessor:
    """A Qwen2-VL-family processor made of a tokenizer and an image processor (no video processor, no torchvision).

    The parts of ``Qwen2_5_VLProcessor`` that agents and the trainer use: ``tokenizer``, ``image_processor``,
    ``image_token``, ``apply_chat_template`` (the tokenizer's template, which renders image content parts as
    ``<|vision_start|><|image_pad|><|vision_end|>``) and ``__call__(text=, images=)``, which widens each image's
    placeholder to its merged patches and tokenizes.
    """

    def __init__(self, tokenizer: Any, image_processor: Any, name_or_path: str = "") -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.name_or_path = name_or_path
        self.image_token = getattr(tokenizer, "image_token", None) or IMAGE_PAD
        self.chat_template = tokenizer.chat_template

    def apply_chat_template(self, conversation: list[dict], **kwargs: Any) -> Any:
        """The tokenizer's rendering with this processor's ``chat_template`` (which an agent may replace, as
        transformers' processors allow), unless the call passes its own."""
        kwargs.setdefault("chat_template", self.chat_template)
        return self.tokenizer.apply_chat_template(conversation, **kwargs)

    def __call__(
        self, text: str | list[str] | None = None, images: Sequence[Any] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        texts = [text] if isinstance(text, str) else list(text or [])
        out: dict[str, Any] = {}
        grids: list[list[int]] = []
        if images:
            pixels = self.image_processor(images=[load_image(i) for i in images], return_tensors="pt")
            out["pixel_values"], out["image_grid_thw"] = pixels["pixel_values"], pixels["image_grid_thw"]
            grids = pixels["image_grid_thw"].tolist()
        merge = int(getattr(self.image_processor, "merge_size", 2))
        widened, used = [], 0
        for t in texts:
            count = t.count(self.image_token)
            widened.append(expand_image_pads(t, grids[used : used + count], merge, self.image_token))
            used += count
        if used != len(grids):
            raise ValueError(f"the text has {used} image placeholders for {len(grids)} images")
        encoded = self.tokenizer(widened, add_special_tokens=False, padding=len(widened) > 1, return_tensors="pt")
        out.update(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])
        return out


def expand_image_pads(text: str, grids: Sequence[Sequence[int]], merge_size: int, image_token: str = IMAGE_PAD) -> str:
    """``text`` with its k-th image placeholder widened to ``prod(grids[k]) // merge_size**2`` of them."""
    parts = text.split(image_token)
    if len(parts) - 1 != len(grids):
        raise ValueError(f"the text has {len(parts) - 1} image placeholders for {len(grids)} images")
    out = [parts[0]]
    for grid, rest in zip(grids, parts[1:]):
        out.append(image_token * (int(grid[0]) * int(grid[1]) * int(grid[2]) // merge_size**2) + rest)
    return "".join(out)


def load_tokenizer(model_path: str) -> Any:
    """The policy's tokenizer from ``model_path``, with an error naming the path when there is none."""
    from transformers import AutoTokenizer

    from lit_agentrl.errors import UserInputError

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as exc:
        raise UserInputError(f"model.model_path={model_path!r}: no loadable tokenizer there ({exc})") from exc


def load_policy_processor(model_path: str) -> Any:
    """A vision-language policy's processor (None for a text policy), with an error naming the path."""
    from lit_agentrl.errors import UserInputError

    try:
        return load_processor(model_path)
    except (OSError, ValueError) as exc:
        raise UserInputError(f"model.model_path={model_path!r}: no loadable image processor there ({exc})") from exc


def load_processor(model_path: str) -> Any:
    """The processor of the vision-language model at ``model_path`` (None for a text model).

    ``AutoProcessor`` first; where it fails (transformers' Qwen2.5-VL processor needs torchvision for its video
    processor), the folder's image processor and tokenizer composed (:class:`ComposedVLProcessor`).
    """
    if not is_vision_language(model_path):
        return None
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        processor = AutoProcessor.from_pretrained(model_path)
        if getattr(processor, "image_processor", None) is not None:
            processor.name_or_path = getattr(processor, "name_or_path", None) or str(model_path)
            return processor
    except (ImportError, OSError, ValueError, TypeError, AttributeError):
        pass
    try:
        image_processor = AutoImageProcessor.from_pretrained(model_path, use_fast=False)
    except (ImportError, OSError, ValueError):
        image_processor = AutoImageProcessor.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return ComposedVLProcessor(tokenizer, image_processor, str(model_path))


def image_token_id(processor: Any) -> int:
    """The id of the processor's image placeholder token."""
    tokenizer = getattr(processor, "tokenizer", processor)
    token = getattr(processor, "image_token", None) or IMAGE_PAD
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int):
        raise ValueError(f"the tokenizer has no single id for the image token {token!r}")
    return token_id


# ------------------------------------------------------------------ images


def load_image(source: Any) -> Any:
    """A PIL RGB image from a PIL image, a path, a ``file://`` or ``data:`` URL, bytes, or a ``{"bytes"}``/
    ``{"path"}``/``{"image"}``/``{"url"}`` dict. ``ValueError`` names what could not be read."""
    from PIL import Image

    if isinstance(source, Image.Image):
        return source if source.mode == "RGB" else source.convert("RGB")
    if isinstance(source, Mapping):
        data = source.get("bytes")
        if data:
            return load_image(bytes(data))
        for key in ("path", "image", "url", "image_url"):
            value = source.get(key)
            if value:
                return load_image(value)
        raise ValueError(f"an image dict needs 'bytes' or 'path', got keys {sorted(source)}")
    if isinstance(source, (bytes, bytearray)):
        try:
            with Image.open(io.BytesIO(source)) as image:
                return image.convert("RGB")
        except OSError as exc:
            raise ValueError(f"image bytes do not decode ({exc})") from exc
    if isinstance(source, str):
        if source.startswith("data:"):
            return load_image(base64.b64decode(source.split(",", 1)[1]))
        if source.startswith(("http://", "https://")):
            raise ValueError(f"image {source!r}: URLs are not fetched; give a local path or the bytes")
        path = source[len("file://") :] if source.startswith("file://") else source
        try:
            with Image.open(path) as image:
                return image.convert("RGB")
        except (OSError, ValueError) as exc:
            raise ValueError(f"image {path!r} does not load ({exc})") from exc
    raise ValueError(f"not an image: {type(source).__name__}")


def image_digest(pixel_values: torch.Tensor) -> str:
    """A digest of one image's pixel values: requests with equal token ids but other images never share KV."""
    data = pixel_values.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# ------------------------------------------------------------------ M-RoPE positions


def mrope_position_ids(
    input_ids: Sequence[int] | torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    image_token_id: int,
    merge_size: int,
) -> tuple[torch.Tensor, int]:
    """Qwen2-VL-family 3-D rotary positions [3, T] of one sequence, and its ``rope_delta``.

    Text tokens advance all three components together; an image's ``grid_h/merge x grid_w/merge`` tokens get
    (t, row, column) offsets from the position where the image starts, and the text after it resumes at that position
    plus ``max(grid_h, grid_w) // merge``. Positions after the sequence are ``index + rope_delta`` in every component.
    The same as the model's ``get_rope_index`` for images (checked in the tests).
    """
    ids = torch.as_tensor(input_ids).tolist()
    grids = [] if image_grid_thw is None else [[int(v) for v in g] for g in image_grid_thw.tolist()]
    columns: list[torch.Tensor] = []
    position, i, image = 0, 0, 0
    while i < len(ids):
        if ids[i] != image_token_id:
            end = i
            while end < len(ids) and ids[end] != image_token_id:
                end += 1
            columns.append(torch.arange(position, position + end - i).expand(3, -1))
            position += end - i
            i = end
            continue
        if image >= len(grids):
            raise ValueError(f"the tokens hold more images than the {len(grids)} given")
        t, h, w = grids[image][0], grids[image][1] // merge_size, grids[image][2] // merge_size
        tt = torch.arange(t).view(-1, 1, 1).expand(t, h, w).reshape(-1)
        hh = torch.arange(h).view(1, -1, 1).expand(t, h, w).reshape(-1)
        ww = torch.arange(w).view(1, 1, -1).expand(t, h, w).reshape(-1)
        count = t * h * w
        if ids[i : i + count] != [image_token_id] * count:
            raise ValueError(f"image {image} needs {count} consecutive image tokens at {i}")
        columns.append(torch.stack([tt, hh, ww]) + position)
        position += max(h, w)
        i += count
        image += 1
    if image != len(grids):
        raise ValueError(f"{len(grids)} images given, the tokens hold {image}")
    positions = torch.cat(columns, dim=1) if columns else torch.zeros((3, 0), dtype=torch.long)
    delta = (int(positions.max()) + 1 - len(ids)) if len(ids) else 0
    return positions.long(), delta


def vision_settings(model: Any) -> tuple[int, int] | None:
    """``(image_token_id, spatial_merge_size)`` of a Qwen2-VL-family model, None for a text model."""
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None)
    token = getattr(config, "image_token_id", None)
    if vision is None or token is None:
        return None
    return int(token), int(getattr(vision, "spatial_merge_size", 2))
