"""The names SGLang's Qwen2(.5)-VL loaders take, from a transformers 5 model's names (no SGLang needed here; the
server-side check is ``test_sglang_vision.py::test_a_weight_push_reaches_the_language_model_and_the_vision_tower``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_agentrl.engines.weight_names import checkpoint_name, checkpoint_names


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen2_vl"])
def test_the_nested_layout_becomes_the_checkpoint_layout(model_type: str) -> None:
    pairs = [
        ("model.language_model.layers.0.self_attn.q_proj.weight", 1),
        ("model.language_model.embed_tokens.weight", 2),
        ("model.language_model.norm.weight", 3),
        ("model.visual.blocks.1.attn.qkv.bias", 4),
        ("model.visual.merger.mlp.0.weight", 5),
        ("lm_head.weight", 6),
    ]
    assert checkpoint_names(pairs, model_type) == [
        ("model.layers.0.self_attn.q_proj.weight", 1),
        ("model.embed_tokens.weight", 2),
        ("model.norm.weight", 3),
        ("visual.blocks.1.attn.qkv.bias", 4),
        ("visual.merger.mlp.0.weight", 5),
        ("lm_head.weight", 6),
    ]


def test_checkpoint_names_are_kept() -> None:
    # A transformers 4 policy (or anything already in the checkpoint layout) passes unchanged: applying it twice is
    # applying it once.
    for name in ("model.layers.0.mlp.up_proj.weight", "visual.blocks.0.norm1.weight", "lm_head.weight"):
        assert checkpoint_name(name, "qwen2_5_vl") == name


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3_vl", "llama", None])
def test_other_models_are_left_alone(model_type: str | None) -> None:
    # Qwen3-VL: SGLang's loader strips ``model.language_model.`` itself; text models have one layout.
    for name in ("model.language_model.layers.0.mlp.up_proj.weight", "model.visual.blocks.0.norm1.weight"):
        assert checkpoint_name(name, model_type) == name


def test_the_tiny_vl_model_maps_onto_its_own_checkpoint(tmp_path: Path) -> None:
    # transformers 5 writes the checkpoint layout: every parameter the trainer pushes maps onto a saved tensor.
    pytest.importorskip("safetensors")
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    from lit_agentrl.models.tiny_vl import save_tiny_vl_model

    path = save_tiny_vl_model(tmp_path)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    with safe_open(str(path / "model.safetensors"), "pt") as saved:
        on_disk = set(saved.keys())
    pushed = [name for name, _ in model.named_parameters()]
    assert any(name.startswith("model.language_model.") for name in pushed)
    assert any(name.startswith("model.visual.") for name in pushed)
    assert {name for name, _ in checkpoint_names(((n, None) for n in pushed), model.config.model_type)} == on_disk
