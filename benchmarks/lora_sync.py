"""LoRA's weight sync against full fine-tuning's, side by side into one kind of engine: bytes and time per push.

(a) full fine-tuning: ``sync_weights(policy)``, every weight; (b) LoRA, ``model.lora.sync: merged``: every weight,
each targeted one with its adapter folded in; (c) LoRA, ``sync: adapter``: the adapters alone, which the engine
serves on its unchanged base. Same model, engine and bucket size; median of ``--repeats`` after one warm-up.

    python benchmarks/lora_sync.py --threads 2 --rank 16
    # in-process SGLang on CPU (its environment, scripts/build_sglang_env.sh, with the test shim):
    PYTHONPATH=tests/sglang_shim SGLANG_USE_CPU_ENGINE=1 "$PY" benchmarks/lora_sync.py --engine sglang
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from shared import SGLANG_CPU, sync_model
from transformers import AutoModelForCausalLM

from lit_agentrl.bridge.lora import adapter_named_parameters, merged_named_parameters
from lit_agentrl.bridge.weights import sync_weights
from lit_agentrl.config.training import Lora
from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.models.tiny import save_tiny_model
from lit_agentrl.training.lora import add_adapters


def start_engine(kind: str, path: str, lora: Lora | None) -> RolloutEngine:
    """The engine the push goes into; SGLang started to serve adapters for ``sync: adapter``, as the trainer starts it."""
    if kind == "transformers":
        return TransformersEngine(path)
    from lit_agentrl.engines.sglang import SGLangEngine

    serving = SGLangEngine.lora_engine_kwargs(lora, SGLANG_CPU) if lora is not None and lora.syncs_adapter else {}
    return SGLangEngine(path, **SGLANG_CPU, **serving)


def timed(push: Callable[[], int], repeats: int) -> float:
    push()  # warm-up: the adapter engine injects its layers on the first push
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        push()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--engine", choices=["transformers", "sglang"], default="transformers")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = sync_model(args.hidden, args.layers)
    bucket = 64 << 20
    with tempfile.TemporaryDirectory() as tmp:
        path = str(save_tiny_model(tmp, cfg))
        full = AutoModelForCausalLM.from_pretrained(path)
        rows = []
        for name, lora in (
            ("full fine-tuning", None),
            ("LoRA, merged", Lora(rank=args.rank, sync="merged")),
            ("LoRA, adapter", Lora(rank=args.rank, sync="adapter")),
        ):
            policy = full if lora is None else add_adapters(AutoModelForCausalLM.from_pretrained(path), lora)
            if lora is not None:
                tensors = (
                    adapter_named_parameters(policy) if lora.sync == "adapter" else merged_named_parameters(policy)
                )
            else:
                tensors = ((n, p.detach()) for n, p in policy.named_parameters())
            size = sum(t.numel() * t.element_size() for _, t in tensors)
            engine = start_engine(args.engine, path, lora)
            try:
                seconds = timed(functools.partial(sync_weights, policy, [engine], bucket, lora=lora), args.repeats)
            finally:
                engine.shutdown()
            rows.append((name, size, seconds))
    print(
        f"{args.engine}: {args.layers} layers, hidden {args.hidden}, rank {args.rank}, {args.threads} threads, "
        f"median of {args.repeats}"
    )
    base_size, base_seconds = rows[0][1], rows[0][2]
    for name, size, seconds in rows:
        print(
            f"  {name:18s} {size / 2**20:8.2f} MiB {seconds * 1000:9.2f} ms   "
            f"bytes x{size / base_size:.3f}  time x{seconds / base_seconds:.3f}"
        )


if __name__ == "__main__":
    main()
