"""Build a tiny, randomly initialised Qwen3 model and a matching tokenizer on local disk.

Model hubs are unreachable from tests and from the CPU quickstart, so both are made here, deterministically,
and saved with ``save_pretrained``: everything downstream loads them back through ``AutoTokenizer`` and
``AutoModelForCausalLM`` from a local path, exactly as it would load a real checkpoint.

Run as a script::

    python -m lit_agentrl.models.tiny --out .cache/tiny-qwen3
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
# Qwen marks these as added (not special) tokens: they survive decoding, so tool calls can be parsed from text.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

_CORPUS = [
    "system user assistant tool",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "You may call one or more functions to assist with the user query.",
    '{"name": "mathlighteval_reward", "arguments": {"answer": "42"}}',
    "The answer is correct. The answer is wrong.",
    "Let x = 3. Then 2x + 1 = 7, so the answer is \\boxed{7}.",
    "\\frac{1}{2} \\sqrt{2} \\pi + - * / = ( ) [ ] { } ^ _ , . : ; ! ? ' \"",
    "0 1 2 3 4 5 6 7 8 9 10 12 24 36 48 100 1000",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "What is the sum of the first ten positive integers? Find the value of x. Compute the area of the circle.",
]


@dataclass
class TinyModelConfig:
    """Sizes of the tiny Qwen3; the defaults give ~0.2M parameters and run a step in milliseconds on CPU."""

    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    seed: int = 0
    tokenizer: str = "bpe"
    """``bpe``: byte-level BPE, lossless on any text; ``words``: a closed word-level vocabulary
    (:data:`QUICKSTART_WORDS`), small enough for a random model to find rewarded answers by chance."""


def chat_template() -> str:
    """The shipped ChatML template (renders ``tools=`` and assistant ``tool_calls``)."""
    return resources.files("lit_agentrl.models").joinpath("chat_template.jinja").read_text()


def build_tokenizer(vocab_size: int = 384, corpus: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (lossless on any text) and wrap it with the ChatML template."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or _CORPUS, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        chat_template=chat_template(),
        clean_up_tokenization_spaces=False,
    )
    wrapped.add_tokens(ADDED_TOKENS, special_tokens=False)
    return wrapped


QUICKSTART_WORDS = [*"0123456789", "system", "user", "assistant", "tool", "=", "?", "higher", "lower", "found", "guess"]
# Whitespace and punctuation become tokens of their own, so decoding with Fuse() restores the text exactly.
_WORD_SPLIT = Regex(r"\s|[^\w\s]|[A-Za-z]+|\d")


def build_word_tokenizer(words: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over a closed vocabulary (digits are single tokens); unknown words map to <unk>."""
    vocab_words = [*SPECIAL_TOKENS, "<unk>", " ", "\n", *(words or QUICKSTART_WORDS)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(dict.fromkeys(vocab_words))}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(_WORD_SPLIT, behavior="isolated")
    tok.decoder = decoders.Fuse()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token="<unk>",
        bos_token=None,
        chat_template=chat_template(),
        clean_up_tokenization_spaces=False,
    )
    wrapped.add_special_tokens({"additional_special_tokens": [IM_START]})
    return wrapped


def build_model(tokenizer: PreTrainedTokenizerFast, cfg: TinyModelConfig) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3 whose vocabulary matches ``tokenizer``; seeded, so rebuilds are identical."""
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny_model(out_dir: str | Path, cfg: TinyModelConfig | None = None) -> Path:
    """Build the tokenizer and model and save both under ``out_dir``; returns the path."""
    cfg = cfg or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.tokenizer not in ("bpe", "words"):
        raise ValueError(f"tokenizer must be 'bpe' or 'words', got {cfg.tokenizer!r}")
    tokenizer = build_tokenizer(cfg.vocab_size) if cfg.tokenizer == "bpe" else build_word_tokenizer()
    tokenizer.save_pretrained(out)
    build_model(tokenizer, cfg).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the model and tokenizer to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", choices=["bpe", "words"], default="bpe")
    args = parser.parse_args(argv)
    print(save_tiny_model(args.out, TinyModelConfig(seed=args.seed, tokenizer=args.tokenizer)))


if __name__ == "__main__":
    main()
