"""The locally built tiny model and tokenizer load like a real checkpoint and are deterministic."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_agentrl.models.tiny import ADDED_TOKENS, TinyModelConfig, save_tiny_model


def test_rebuild_is_identical(tiny_model_dir, tmp_path):
    again = save_tiny_model(tmp_path / "again")
    a = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert AutoTokenizer.from_pretrained(again).get_vocab() == AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()


def test_seed_changes_weights(tiny_model_dir, tmp_path):
    other = save_tiny_model(tmp_path / "other", TinyModelConfig(seed=1))
    a = AutoModelForCausalLM.from_pretrained(tiny_model_dir).model.embed_tokens.weight
    b = AutoModelForCausalLM.from_pretrained(other).model.embed_tokens.weight
    assert not torch.equal(a, b)


def test_tokenizer_is_lossless_and_keeps_tool_tokens(tokenizer):
    text = 'Solve: \\frac{1}{2} + é ✓ <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    for token in ADDED_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_chat_template_renders_tools_and_tool_calls(tokenizer):
    tools = [{"type": "function", "function": {"name": "check", "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "check", "arguments": {"a": 1}}}],
        },
        {"role": "tool", "content": "ok"},
        {"role": "tool", "content": "ok2"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nS\n\n# Tools") and '"name": "check"' in text
    assert '<tool_call>\n{"name": "check", "arguments": {"a": 1}}\n</tool_call><|im_end|>\n' in text
    assert (
        "<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<tool_response>\nok2\n</tool_response><|im_end|>\n"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_model_matches_tokenizer(policy_model, tokenizer):
    assert policy_model.config.vocab_size == len(tokenizer)
    assert policy_model.generation_config.eos_token_id == tokenizer.eos_token_id
