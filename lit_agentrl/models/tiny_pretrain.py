"""A "pretrained" tiny base for the LoRA quickstart: the quickstart model taught, by a few seconds of supervised
training, to answer ``a =`` with a digit (half its probability on ``a`` itself, the rest spread over all digits).

LoRA trains adapters on a frozen base, and a frozen random 64-wide head bounds every logit near 1.3, so on the random
quickstart model no adapter can make the right digit likely (docs/lora.md). A pretrained model's head has the range
already; this base gives the tiny model one, and leaves ``(a + 1) % 10``, the quickstart's task, to RL::

    python -m lit_agentrl.models.tiny --tokenizer words --out .cache/quickstart-model
    python -m lit_agentrl.models.tiny_pretrain --base .cache/quickstart-model --out .cache/quickstart-lora-base
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

COPY_WEIGHT = 0.5
"""The answer's probability mass on ``a`` itself; the rest is spread evenly over the ten digits."""


def pretrain(base: str | Path, out: str | Path, steps: int = 200, lr: float = 1e-3, seed: int = 0) -> Path:
    """Train ``base`` on ``a =`` -> (a digit, then end of turn) for ``steps`` full-batch AdamW steps; save to ``out``."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        digits = [tokenizer.encode(str(d), add_special_tokens=False)[0] for d in range(10)]
        prompts = [_prompt(tokenizer, a) for a in range(10)]
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        for _ in range(steps):
            losses = [_loss(model, prompt, digits, a, tokenizer.eos_token_id) for a, prompt in enumerate(prompts)]
            optimizer.zero_grad()
            torch.stack(losses).mean().backward()
            optimizer.step()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return Path(out)


def _prompt(tokenizer: object, a: int) -> list[int]:
    text = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        [{"role": "user", "content": f"{a} ="}], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]


def _loss(model: torch.nn.Module, prompt: list[int], digits: list[int], a: int, eos: int) -> torch.Tensor:
    """Cross-entropy of the answer against the soft target, and of the end of turn after it."""
    logits = model(input_ids=torch.tensor([[*prompt, digits[a], eos]])).logits[0]
    target = torch.zeros(logits.shape[-1])
    target[digits] = (1 - COPY_WEIGHT) / len(digits)
    target[digits[a]] += COPY_WEIGHT
    answer = -(target * torch.log_softmax(logits[len(prompt) - 1].float(), -1)).sum()
    return answer + torch.nn.functional.cross_entropy(logits[len(prompt)].float(), torch.tensor(eos))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base", required=True, help="the tiny quickstart model (lit_agentrl.models.tiny --tokenizer words)"
    )
    parser.add_argument("--out", required=True, help="directory to write the pretrained base to")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    print(pretrain(args.base, args.out, args.steps))


if __name__ == "__main__":
    main()
