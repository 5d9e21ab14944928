"""Weight names as SGLang's model loaders take them, from the names of the trainer's transformers model.

transformers 5 loads Qwen2-VL and Qwen2.5-VL checkpoints into a nested layout (``model.language_model.layers.0...``,
``model.visual.blocks.0...``, ``lm_head.weight``) and writes them back in the checkpoint layout
(``model.layers.0...``, ``visual.blocks.0...``, ``lm_head.weight``): transformers' own renaming for
``Qwen2_5_VLForConditionalGeneration`` is ``^visual`` -> ``model.visual`` and
``^model(?!\\.(language_model|visual))`` -> ``model.language_model``. SGLang 0.5.23's ``load_weights`` for these two
models (``sglang/srt/models/qwen2_5_vl.py`` and ``qwen2_vl.py``), which ``update_weights_from_tensor`` calls
directly, looks names up in its own parameters, which have the checkpoint layout, and renames nothing: a
nested name is skipped without a word (norms, ``attn.qkv``, the patch embedding, the merger), or, for a stacked
projection (``q_proj``/``k_proj``/``v_proj``, ``gate_proj``/``up_proj``, in every decoder layer and vision block),
renamed to ``qkv_proj``/``gate_up_proj`` and then looked up, which raises ``KeyError`` in the scheduler and takes the
server down. Its ``hf_to_sglang_mapper`` is only applied to quantization configs. SGLang's Qwen3-VL loader maps the nested names
itself, so it needs nothing here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")

NESTED_TO_CHECKPOINT: dict[str, tuple[tuple[str, str], ...]] = {
    model_type: (("model.language_model.", "model."), ("model.visual.", "visual."))
    for model_type in ("qwen2_vl", "qwen2_5_vl")
}
"""Per ``config.model_type``: (prefix transformers 5 uses, prefix of the checkpoint and SGLang's loader)."""


def checkpoint_name(name: str, model_type: str | None) -> str:
    """``name`` (a transformers state-dict name) as SGLang's loader for ``model_type`` takes it; unchanged for
    other model types, and for names already in the checkpoint layout."""
    for nested, flat in NESTED_TO_CHECKPOINT.get(model_type or "", ()):
        if name.startswith(nested):
            return flat + name[len(nested) :]
    return name


def checkpoint_names(pairs: Iterable[tuple[str, T]], model_type: str | None) -> list[tuple[str, T]]:
    """``(name, value)`` pairs with each name as :func:`checkpoint_name` writes it, in order."""
    return [(checkpoint_name(name, model_type), value) for name, value in pairs]
