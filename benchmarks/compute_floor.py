"""The compute floor of GRPO steps: the least work the recorded steps could have cost on this machine.

For each step recorded by ``vs_trl.py`` (every trajectory's prompt and token ids), the floor is
  generation  one batched decode of exactly the recorded completion lengths: one prefill of the
              left-padded prompts, then one decode step per token in which only the rows that still
              have tokens to produce take part (a row leaves the batch and its KV cache the moment it
              reaches its length), sampling at temperature 1;
  training    one forward/backward of the GRPO surrogate over exactly the recorded sequences, with no
              padding at all (sequences of equal length share a forward), then gradient clipping and
              one AdamW step.
No agents, rewards, schedulers, loggers or threads: only the model's own arithmetic and a minimal loop.

    python benchmarks/compute_floor.py --model DIR --steps STEPS.jsonl --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache


def floor_generation(model: torch.nn.Module, prompts: list[list[int]], lengths: list[int], pad_id: int) -> float:
    """Seconds to sample exactly ``lengths[i]`` tokens after ``prompts[i]``, finished rows leaving the batch."""
    start = time.perf_counter()
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    remaining = torch.tensor(lengths)
    positions = torch.tensor([len(p) for p in prompts])
    cache = DynamicCache()
    with torch.inference_mode():
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        while True:
            tokens = torch.multinomial(torch.softmax(logits.float(), -1), 1)
            remaining -= 1
            alive = remaining > 0
            if not alive.any():
                break
            if not alive.all():  # finished rows leave the batch and its cache
                keep = alive.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                mask, remaining, positions, tokens = mask[keep], remaining[keep], positions[keep], tokens[keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            logits = model(
                input_ids=tokens, attention_mask=mask, position_ids=positions.unsqueeze(-1), cache=cache, use_cache=True
            ).logits[:, -1]
            positions = positions + 1
    return time.perf_counter() - start


def floor_training(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, sequences: list[list[int]], prompt_lengths: list[int]
) -> tuple[float, float, float]:
    """Seconds of (forward, backward, optimizer) over exactly ``sequences``: equal lengths share a forward."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, seq in enumerate(sequences):
        by_length[len(seq)].append(i)
    n_tokens = sum(len(s) - p for s, p in zip(sequences, prompt_lengths))
    forward = backward = 0.0
    for length, members in by_length.items():
        start = time.perf_counter()
        ids = torch.tensor([sequences[i] for i in members])
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        mask = torch.tensor([[0.0] * (prompt_lengths[i] - 1) + [1.0] * (length - prompt_lengths[i]) for i in members])
        advantages = torch.randn(len(members), 1)
        ratio = torch.exp(logprobs - logprobs.detach())
        loss = -(torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages) * mask).sum() / n_tokens
        middle = time.perf_counter()
        loss.backward()
        forward, backward = forward + middle - start, backward + time.perf_counter() - middle
    start = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return forward, backward, time.perf_counter() - start


def measure(model_dir: str, steps_file: str, threads: int, lr: float = 1e-5) -> list[dict[str, float]]:
    """Floor seconds for every recorded step: generation, forward, backward, optimizer and their total."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    pad_id = model.config.pad_token_id or 0
    steps = [json.loads(line) for line in Path(steps_file).read_text().splitlines() if line.strip()]
    results = []
    for step in [steps[0], *steps]:  # the first step twice: once to warm up, not reported
        prompts = step["prompt_ids"]
        sequences = step["token_ids"]
        lengths = [len(s) - len(p) for s, p in zip(sequences, prompts)]
        generation = floor_generation(model, prompts, lengths, pad_id)
        forward, backward, opt = floor_training(model, optimizer, sequences, [len(p) for p in prompts])
        results.append(
            {
                "generation": generation,
                "forward": forward,
                "backward": backward,
                "optimizer": opt,
                "total": generation + forward + backward + opt,
            }
        )
    return results[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model directory the steps were run with")
    parser.add_argument(
        "--steps", required=True, help="JSON lines, one per step: prompt_ids and token_ids per trajectory"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="write the per-step floors here as JSON")
    args = parser.parse_args()
    results = measure(args.model, args.steps, args.threads)
    if args.out:
        Path(args.out).write_text(json.dumps(results))
    for key in ("generation", "forward", "backward", "optimizer", "total"):
        print(f"{key:>10}: median {statistics.median(r[key] for r in results):.3f} s over {len(results)} steps")


if __name__ == "__main__":
    main()
