"""Training throughput on a batch of mixed lengths: packed micro-batches vs padding to the longest.

The same 64 trajectories (prompt 32 tokens, responses of 8..320 tokens) go through forward, backward and
the GRPO loss three times per round, micro-batches of the same token budget each time: (a) what the module
ships, sequences packed into rows (``plan_micro_batches(packing=True)``); (b) one sequence per row, rows
sorted by length, each micro-batch padded to its own longest; (c) every sequence padded to the longest of
the batch. Reported: useful (unpadded) tokens per second, median of rounds, and (a) / (c).

    python benchmarks/train_throughput.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from shared import SHARED_MODEL
from transformers import AutoModelForCausalLM

from lit_agentrl.config.training import Loss
from lit_agentrl.models.tiny import save_tiny_model
from lit_agentrl.training.batching import TrainingSample, collate, plan_micro_batches
from lit_agentrl.training.losses import token_logprobs
from lit_agentrl.training.objective import loss_scale, micro_batch_loss

LOSS = Loss(entropy_coef=0.0)


def make_samples(n: int, vocab: int, seed: int = 0) -> list[TrainingSample]:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(n):
        response = int(torch.randint(8, 321, (1,), generator=g))
        ids = torch.randint(10, vocab, (32 + response,), generator=g).tolist()
        mask = [0] * 31 + [1] * response
        samples.append(TrainingSample(ids[:-1], ids[1:], mask, [-1.0] * len(mask), float(torch.randn(1, generator=g))))
    return samples


def padded_to_longest(samples: list[TrainingSample], pad: int) -> list[TrainingSample]:
    width = max(len(s) for s in samples)
    return [
        TrainingSample(
            s.input_ids + [pad] * (width - len(s)),
            s.targets + [pad] * (width - len(s)),
            s.loss_mask + [0] * (width - len(s)),
            s.old_logprobs + [0.0] * (width - len(s)),
            s.advantage,
        )
        for s in samples
    ]


def step(model, samples: list[TrainingSample], plans: list[list[list[int]]], pad: int) -> None:
    scale = loss_scale(samples)
    for plan in plans:
        micro = collate([[samples[i] for i in row] for row in plan], pad)
        policy = token_logprobs(model(**micro.model_inputs()).logits, micro.targets, with_entropy=True)
        loss, _ = micro_batch_loss(LOSS, None, micro, policy, scale)
        loss.backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=int, default=4096, help="tokens per micro-batch (rows x padded length)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = AutoModelForCausalLM.from_pretrained(save_tiny_model(tmp, SHARED_MODEL)).train()
    pad = model.config.pad_token_id
    samples = make_samples(64, model.config.vocab_size)
    padded = padded_to_longest(samples, pad)
    useful = sum(len(s) for s in samples)
    ways = {
        "packed rows (shipped)": (samples, plan_micro_batches(samples, args.budget)),
        "length-sorted, one per row": (samples, plan_micro_batches(samples, args.budget, packing=False)),
        "padded to the longest": (padded, plan_micro_batches(padded, args.budget, packing=False)),
    }
    results: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.rounds + 1):
        for name, (batch, plans) in ways.items():
            start = time.perf_counter()
            step(model, batch, plans, pad)
            if round_:
                results[name].append(useful / (time.perf_counter() - start))
    print(
        f"64 sequences, {useful} useful tokens (longest {max(len(s) for s in samples)}), budget {args.budget}, "
        f"{args.threads} threads, median of {args.rounds}"
    )
    medians = {name: statistics.median(v) for name, v in results.items()}
    for name, tps in medians.items():
        print(f"  {name:28s} {tps:9.0f} useful tokens/s  ({len(ways[name][1])} micro-batches)")
    packed, _, padded_tps = medians.values()
    print(f"  packed / padded {packed / padded_tps:.2f}   (target >= 1.5)")


if __name__ == "__main__":
    main()
