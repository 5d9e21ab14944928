"""The model every side-by-side benchmark trains: the performance issue's shared config."""

from __future__ import annotations

from lit_agentrl.models.tiny import TinyModelConfig

SHARED_MODEL = TinyModelConfig(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)
"""A 2.5M-parameter Qwen3 (hidden 256, 4 layers, BPE vocabulary of 384): large enough that compute matters on CPU."""

SGLANG_CPU = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "dtype": "float32",
    "mem_fraction_static": 0.05,
    "max_total_tokens": 4096,
}
"""In-process SGLang on CPU (its environment, with the test shim): torch_native attention, float32, a small KV cache."""


def sync_model(hidden: int, layers: int) -> TinyModelConfig:
    """The weight-sync benchmarks' model: ``layers`` Qwen3 layers of width ``hidden`` (512 x 8: 121 MiB in fp32)."""
    return TinyModelConfig(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=hidden // 8,
    )
