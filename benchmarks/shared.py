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
