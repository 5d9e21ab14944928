"""Engines side by side: the same rollout workloads through the transformers engine and SGLang, on CPU.

Workloads: (1) 64 single-turn requests of 64 sampled tokens each (EOS ignored), straight to the engine;
(2) a matheval batch (8 MATH-style prompts x 4 samples) through the rollout manager and the LangGraph agent.
Each engine serves both over ``--repeats`` rounds after a warm-up round; medians are reported. The engines
run one after the other, not interleaved: SGLang's scheduler process keeps polling while idle, and on a
2-core machine it would take CPU from the transformers engine. Runs in the SGLang environment (it has both)::

    PY="$(scripts/build_sglang_env.sh)"
    SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tests/sglang_shim "$PY" benchmarks/engines.py
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from shared import SGLANG_CPU
from transformers import AutoTokenizer

from lit_agentrl.models.tiny import TinyModelConfig, save_tiny_model
from lit_agentrl.rollout.manager import RolloutManager

REPO = Path(__file__).resolve().parents[1]
SGLANG_ARGS = {**SGLANG_CPU, "max_total_tokens": 16384}  # room for a matheval batch's KV cache


def single_turn(engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0}

    async def all_requests():
        return await asyncio.gather(
            *(engine.async_generate(input_ids=p, sampling_params=params, return_logprob=True) for p in prompts)
        )

    loop = engine.loop or asyncio.new_event_loop()
    start = time.perf_counter()
    results = loop.run_until_complete(all_requests())
    return time.perf_counter() - start, sum(len(r["output_ids"]) for r in results)


def matheval(manager: RolloutManager, rows: list[dict], samples: int, new_tokens: int) -> tuple[float, int]:
    start = time.perf_counter()
    batch = manager.generate(rows, samples, {"max_new_tokens": new_tokens, "temperature": 1.0})
    assert batch.stats.num_failed == 0, batch.stats.failure_reasons
    return time.perf_counter() - start, batch.stats.generated_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from lit_agentrl.engines.hf import TransformersEngine
    from lit_agentrl.engines.sglang import SGLangEngine

    with tempfile.TemporaryDirectory() as tmp:
        path = str(
            save_tiny_model(
                tmp,
                TinyModelConfig(
                    hidden_size=256,
                    intermediate_size=1024,
                    num_hidden_layers=4,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    head_dim=64,
                ),
            )
        )
        tokenizer = AutoTokenizer.from_pretrained(path)
        g = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(10, 300, (int(n),), generator=g).tolist() for n in torch.randint(16, 48, (64,), generator=g)
        ]
        rows = [
            json.loads(line) for line in Path(REPO / "data/samples/math_sample_train.jsonl").read_text().splitlines()
        ][:8]
        for row in rows:
            row["agent_cfg_path"] = str(REPO / row["agent_cfg_path"])
        factories = {
            "transformers": lambda: TransformersEngine(path),
            "sglang": lambda: SGLangEngine(path, **SGLANG_ARGS),
        }
        results: dict[tuple[str, str], list[tuple[float, int]]] = {}
        for name, factory in factories.items():
            engine = factory()
            manager = RolloutManager([engine], tokenizer, reward_fn="math", check_template_drift=False)
            workloads = {
                "64 single-turn x 64 tokens": functools.partial(single_turn, engine, prompts, 64),
                "matheval 8 prompts x 4": functools.partial(matheval, manager, rows, 4, 64),
            }
            for round_ in range(args.repeats + 1):  # round 0 warms up
                for workload, run in workloads.items():
                    measured = run()
                    if round_:
                        results.setdefault((workload, name), []).append(measured)
            engine.shutdown()

    print(f"tiny Qwen3 (hidden 256, 4 layers), CPU, {args.threads} threads, median of {args.repeats}")
    for (workload, name), runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        tokens = statistics.median(t for _, t in runs)
        print(f"  {workload:28s} {name:13s} {seconds:7.3f} s  {tokens / seconds:9.0f} tokens/s")


if __name__ == "__main__":
    main()
