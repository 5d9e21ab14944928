"""Weight sync into the CPU engine vs a plain copy of the same tensors.

(a) ``sync_weights(policy, [TransformersEngine])``: the trainer's path (gather per parameter, buckets, the
engine's checked ``update_weights_from_tensor``); (b) ``param.copy_(source)`` over the same tensors.

    python benchmarks/weight_sync.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from shared import sync_model
from transformers import AutoModelForCausalLM

from lit_agentrl.bridge.weights import sync_weights
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.models.tiny import save_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = sync_model(args.hidden, args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(save_tiny_model(tmp, cfg))
        policy = AutoModelForCausalLM.from_pretrained(path)
        engine = TransformersEngine(path)
        target = {n: p for n, p in AutoModelForCausalLM.from_pretrained(path).named_parameters()}
        sources = list(policy.named_parameters())
        timings: dict[str, list[float]] = {"sync_weights into the engine": [], "plain copy_": []}
        for round_ in range(args.repeats + 1):
            start = time.perf_counter()
            sync_weights(policy, [engine], bucket_bytes=64 << 20)
            synced = time.perf_counter() - start
            start = time.perf_counter()
            with torch.no_grad():
                for name, param in sources:
                    target[name].copy_(param.detach())
            copied = time.perf_counter() - start
            if round_:
                timings["sync_weights into the engine"].append(synced)
                timings["plain copy_"].append(copied)
        engine.shutdown()
    size = sum(p.numel() * p.element_size() for _, p in sources)
    print(f"{size / 2**20:.1f} MiB of weights, {args.threads} threads, median of {args.repeats}")
    medians = {k: statistics.median(v) for k, v in timings.items()}
    for name, seconds in medians.items():
        print(f"  {name:30s} {seconds * 1000:8.2f} ms")
    a, b = medians.values()
    print(f"  ratio {a / b:.2f}   (target <= 1.5)")


if __name__ == "__main__":
    main()
