"""Build a tiny, randomly initialised Qwen2.5-VL model, its tokenizer and image processor on local disk.

The vision-language counterpart of :mod:`lit_agentrl.models.tiny`, for tests of the seed's vision-language agents
(Geometry3K): transformers' ``Qwen2_5_VLForConditionalGeneration`` with a two-layer text model and a two-block
vision tower, the byte-level BPE tokenizer of :mod:`~lit_agentrl.models.tiny` with Qwen's vision tokens
(``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``, ``<|video_pad|>``) and a ChatML template that renders
image content parts as ``<|vision_start|><|image_pad|><|vision_end|>``, and the PIL (slow) Qwen2-VL image processor
with small ``min_pixels``/``max_pixels`` (a 56x56 image becomes 16 patches, 4 image tokens). All saved with
``save_pretrained``: ``Qwen2_5_VLForConditionalGeneration``/``AutoModelForImageTextToText``, ``AutoTokenizer``
and ``AutoImageProcessor`` load it back; ``AutoProcessor`` too where torchvision is installed (transformers'
Qwen2.5-VL processor always builds a video processor, which needs torchvision).

Run as a script::

    python -m lit_agentrl.models.tiny_vl --out .cache/tiny-qwen2_5_vl
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from lit_agentrl.models.tiny import QUICKSTART_WORDS, build_tokenizer, build_word_tokenizer, chat_template

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
PROCESSOR_CLASS = "Qwen2_5_VLProcessor"
VISION_WORDS = [*QUICKSTART_WORDS, "red", "green", "blue", "yellow", "colour", "what", "is", "the", "square"]
"""The ``words`` tokenizer's vocabulary: the quickstart's words and the vision quickstart's colours and question."""

# Renders a message's content: a string as is; a list of parts (OpenAI/LangChain/Qwen layouts) with each image or
# video part as Qwen's placeholder, which the processor widens to one pad token per merged patch.
_CONTENT_MACRO = """{%- macro render_content(content) -%}
{%- if content is string -%}{{- content -}}
{%- else -%}{%- for part in content -%}
{%- if part.type == 'text' -%}{{- part.text -}}
{%- elif part.type in ('image', 'image_url', 'input_image') or part.image is defined or part.image_url is defined -%}
{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
{%- elif part.type == 'video' or part.video is defined -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
"""


@dataclass
class TinyVLConfig:
    """Sizes of the tiny Qwen2.5-VL; the defaults give ~0.2M parameters and build in about a second on CPU."""

    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    mrope_section: tuple[int, int, int] = (4, 6, 6)
    """Rotary dimensions for time, height and width; they sum to half the head size (64 / 2 heads / 2)."""
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_intermediate_size: int = 64
    vision_num_heads: int = 2
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 112 * 112
    """At most 112x112 pixels reach the vision tower: 64 patches, 16 image tokens per image."""
    seed: int = 0
    tokenizer: str = "bpe"
    """``bpe``: byte-level BPE; ``words``: the closed word-level vocabulary :data:`VISION_WORDS` (the vision
    quickstart's: a random model names a colour by chance often enough for GRPO to start)."""


def vl_chat_template() -> str:
    """The shipped ChatML template (:func:`~lit_agentrl.models.tiny.chat_template`) with every message content
    rendered through ``render_content``, so image parts become Qwen's vision placeholders; text-only chats render
    exactly as with the text template (the token-exact suffix logic relies on the same turn layout)."""
    text = chat_template()
    rendered, count = re.subn(r"(messages\[0\]|message)\.content(?= \+)", r"render_content(\1.content)", text)
    assistant = "(message.content or '')"
    if count != 4 or text.count(assistant) != 1:
        raise RuntimeError("the shipped chat template changed: update vl_chat_template's content substitutions")
    return _CONTENT_MACRO + rendered.replace(assistant, f"render_content{assistant}")


def build_vl_tokenizer(vocab_size: int = 384, kind: str = "bpe") -> PreTrainedTokenizerFast:
    """The tiny BPE (or ``words``) tokenizer with the vision tokens (special: one id each) and
    :func:`vl_chat_template`."""
    if kind not in ("bpe", "words"):
        raise ValueError(f"tokenizer must be 'bpe' or 'words', got {kind!r}")
    tokenizer = build_tokenizer(vocab_size) if kind == "bpe" else build_word_tokenizer(VISION_WORDS)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = vl_chat_template()
    return tokenizer


def build_image_processor(cfg: TinyVLConfig) -> Any:
    """The PIL Qwen2-VL image processor (torchvision-free), sized to the tiny vision tower."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=cfg.min_pixels,
        max_pixels=cfg.max_pixels,
        patch_size=cfg.patch_size,
        merge_size=cfg.spatial_merge_size,
        temporal_patch_size=cfg.temporal_patch_size,
    )


def build_vl_model(tokenizer: PreTrainedTokenizerFast, cfg: TinyVLConfig) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised Qwen2.5-VL whose vocabulary and vision token ids match ``tokenizer``; seeded."""
    ids = {token: _token_id(tokenizer, token) for token in VISION_TOKENS}
    special = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "max_position_embeddings": cfg.max_position_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": list(cfg.mrope_section)},
            "bos_token_id": None,
            **special,
        },
        vision_config={
            "depth": cfg.vision_depth,
            "hidden_size": cfg.vision_hidden_size,
            "intermediate_size": cfg.vision_intermediate_size,
            "num_heads": cfg.vision_num_heads,
            "patch_size": cfg.patch_size,
            "spatial_merge_size": cfg.spatial_merge_size,
            "temporal_patch_size": cfg.temporal_patch_size,
            "window_size": cfg.patch_size * cfg.spatial_merge_size * 4,
            "out_hidden_size": cfg.hidden_size,
            "fullatt_block_indexes": [cfg.vision_depth - 1],
        },
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
        **special,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.update(**special)
    return model


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int):
        raise TypeError(f"expected one id for {token!r}, got {token_id!r}")
    return token_id


def save_tiny_vl_model(out_dir: str | Path, cfg: TinyVLConfig | None = None) -> Path:
    """Build the tokenizer, image processor and model and save them under ``out_dir``; returns the path."""
    cfg = cfg or TinyVLConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vl_tokenizer(cfg.vocab_size, cfg.tokenizer)
    tokenizer.save_pretrained(out)
    build_image_processor(cfg).save_pretrained(out)
    build_vl_model(tokenizer, cfg).save_pretrained(out)
    # What a processor's save_pretrained writes beside its parts; built here because building the processor itself
    # needs torchvision (its video processor), which a CPU-only install may lack.
    (out / "processor_config.json").write_text(json.dumps({"processor_class": PROCESSOR_CLASS}, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the model, tokenizer and processor to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", choices=["bpe", "words"], default="bpe")
    args = parser.parse_args(argv)
    print(save_tiny_vl_model(args.out, TinyVLConfig(seed=args.seed, tokenizer=args.tokenizer)))


if __name__ == "__main__":
    main()
