"""Rollout throughput: the same 64 single-turn requests served three ways, side by side in one run.

(a) the transformers engine's concurrent API (64 ``async_generate`` calls in flight),
(b) one batched ``model.generate`` call over the same prompts (the static-batching reference),
(c) the engine serving one request at a time.

Every request samples (temperature 1) exactly ``--new-tokens`` tokens (EOS ignored), so all three
produce the same number of tokens. Reported: median tokens/s over ``--repeats`` interleaved rounds
and the ratios (a)/(b) and (a)/(c).

    python benchmarks/rollout_throughput.py --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM

from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.models.tiny import TinyModelConfig, save_tiny_model


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 48, (n,), generator=g).tolist()
    return [torch.randint(10, vocab, (length,), generator=g).tolist() for length in lengths]


def run_concurrent(engine: TransformersEngine, prompts: list[list[int]], new_tokens: int) -> int:
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0}

    async def all_requests():
        return await asyncio.gather(
            *(engine.async_generate(input_ids=p, sampling_params=params, return_logprob=True) for p in prompts)
        )

    return sum(len(r["output_ids"]) for r in asyncio.run(all_requests()))


def run_sequential(engine: TransformersEngine, prompts: list[list[int]], new_tokens: int) -> int:
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0}
    return sum(
        len(engine.generate(input_ids=p, sampling_params=params, return_logprob=True)["output_ids"]) for p in prompts
    )


@torch.inference_mode()
def run_batched_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int) -> int:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad_id,
    )
    return (out.shape[1] - width) * len(prompts)


def timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256, help="model width (256 x 4 layers is ~2.5M parameters)")
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    cfg = TinyModelConfig(
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=args.hidden // 4,
        vocab_size=600,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny_model(tmp, cfg)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        engine = TransformersEngine(str(path))
        prompts = make_prompts(args.requests, model.config.vocab_size)
        pad = model.generation_config.pad_token_id
        ways = {
            "(a) engine, concurrent": lambda: run_concurrent(engine, prompts, args.new_tokens),
            "(b) one batched generate": lambda: run_batched_generate(model, prompts, args.new_tokens, pad),
            "(c) engine, one at a time": lambda: run_sequential(engine, prompts, args.new_tokens),
        }
        for fn in ways.values():  # warm-up
            fn()
        results: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeats):
            for name, fn in ways.items():
                seconds, tokens = timed(fn)
                results[name].append(tokens / seconds)
        engine.shutdown()

    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {n_params / 1e6:.2f}M parameters; {args.requests} requests x {args.new_tokens} new tokens; "
        f"threads={args.threads}; median of {args.repeats}"
    )
    median = {name: statistics.median(v) for name, v in results.items()}
    for name, tps in median.items():
        print(f"  {name:28s} {tps:10.0f} tokens/s")
    a, b, c = median.values()
    print(f"  (a)/(b) = {a / b:.2f}   (target >= 0.8)")
    print(f"  (a)/(c) = {a / c:.2f}   (target >= 4)")


if __name__ == "__main__":
    main()
