"""The tiny Qwen2.5-VL builds quickly, loads back like a real checkpoint, and sees images."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("PIL")

from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

from lit_agentrl.models.tiny import build_tokenizer
from lit_agentrl.models.tiny_vl import IMAGE_PAD, VISION_END, VISION_START, TinyVLConfig, save_tiny_vl_model

QUESTION = [
    {
        "role": "user",
        "content": [{"type": "image", "image": "figure.png"}, {"type": "text", "text": "Find x."}],
    }
]


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    start = time.perf_counter()
    out = save_tiny_vl_model(tmp_path_factory.mktemp("tiny-qwen2_5_vl"))
    assert time.perf_counter() - start < 30  # about a second; generous for a loaded 2-core machine
    return out


@pytest.fixture(scope="module")
def loaded(vl_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(vl_dir)
    image_processor = AutoImageProcessor.from_pretrained(vl_dir, use_fast=False)
    model = AutoModelForImageTextToText.from_pretrained(vl_dir).eval()
    return tokenizer, image_processor, model


def _figure() -> Image.Image:
    pixels = torch.arange(56 * 56 * 3, dtype=torch.int64).reshape(56, 56, 3) % 256
    return Image.fromarray(pixels.to(torch.uint8).numpy())


def _model_inputs(tokenizer, image_processor) -> dict[str, torch.Tensor]:
    """What the Qwen2.5-VL processor does: render the chat, widen each image placeholder to its merged patches."""
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    images = image_processor(images=[_figure()], return_tensors="pt")
    merge = image_processor.merge_size
    pads = int(images["image_grid_thw"][0].prod()) // (merge * merge)
    text = text.replace(IMAGE_PAD, IMAGE_PAD * pads)
    encoded = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    return {**encoded, "pixel_values": images["pixel_values"], "image_grid_thw": images["image_grid_thw"]}


def test_chat_template_renders_the_image_placeholder(loaded) -> None:
    tokenizer, _, _ = loaded
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert text == f"<|im_start|>user\n{VISION_START}{IMAGE_PAD}{VISION_END}Find x.<|im_end|>\n<|im_start|>assistant\n"
    for token in (VISION_START, IMAGE_PAD, VISION_END):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1


def test_text_chats_render_as_with_the_text_template(loaded) -> None:
    tokenizer, _, _ = loaded
    tools = [{"type": "function", "function": {"name": "check", "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "check", "arguments": {}}}]},
        {"role": "tool", "content": "ok"},
    ]
    for kwargs in ({"tools": tools}, {}):
        expected = build_tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs) == expected


def test_image_processor_is_small(loaded) -> None:
    _, image_processor, _ = loaded
    images = image_processor(images=[_figure()], return_tensors="pt")
    assert images["image_grid_thw"].tolist() == [[1, 4, 4]]  # 56x56 pixels: 4x4 patches of 14, 4 image tokens
    assert images["pixel_values"].shape == (16, 3 * 2 * 14 * 14)


def test_forward_and_generate_with_an_image(loaded) -> None:
    tokenizer, image_processor, model = loaded
    inputs = _model_inputs(tokenizer, image_processor)
    image_pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert model.config.image_token_id == image_pad
    assert int((inputs["input_ids"] == image_pad).sum()) == 4
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()
    generated = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    prompt_length = inputs["input_ids"].shape[1]
    assert prompt_length < generated.shape[1] <= prompt_length + 3  # fewer when it draws the end of turn
    assert torch.equal(generated[:, :prompt_length], inputs["input_ids"])


def test_the_image_changes_the_logits(loaded) -> None:
    tokenizer, image_processor, model = loaded
    inputs = _model_inputs(tokenizer, image_processor)
    with torch.no_grad():
        seen = model(**inputs).logits[0, -1]
        other = model(**{**inputs, "pixel_values": torch.zeros_like(inputs["pixel_values"])}).logits[0, -1]
    assert not torch.allclose(seen, other)


def test_rebuild_is_identical_and_seeded(vl_dir: Path, tmp_path: Path) -> None:
    from transformers import Qwen2_5_VLForConditionalGeneration

    a = Qwen2_5_VLForConditionalGeneration.from_pretrained(vl_dir).state_dict()
    b = Qwen2_5_VLForConditionalGeneration.from_pretrained(save_tiny_vl_model(tmp_path / "again")).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = Qwen2_5_VLForConditionalGeneration.from_pretrained(save_tiny_vl_model(tmp_path / "c", TinyVLConfig(seed=1)))
    assert not torch.equal(c.state_dict()["lm_head.weight"], a["lm_head.weight"])


def test_auto_processor_loads_it(vl_dir: Path) -> None:
    pytest.importorskip("torchvision", reason="transformers' Qwen2.5-VL processor builds a video processor")
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(vl_dir)
    text = processor.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    encoded = processor(text=[text], images=[_figure()], return_tensors="pt")
    assert int((encoded["input_ids"] == processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)).sum()) == 4
