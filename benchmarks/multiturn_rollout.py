"""One multi-turn quickstart rollout (16 prompts x 8 guess_digit games, 3 one-token turns) through the rollout
manager and the transformers engine, with the garbage collector as it comes and with what setup loaded frozen
(what RolloutCallback does), alternated in one run. Reports median seconds per rollout and the engine's share.

    python -m lit_agentrl.models.tiny --tokenizer words --out .cache/quickstart-model
    python benchmarks/multiturn_rollout.py --rounds 6
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

from transformers import AutoTokenizer

import lit_agentrl.agents  # noqa: F401  registers guess_digit
from lit_agentrl.data import load_rows
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.rollout.manager import RolloutManager

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {"max_new_tokens": 1, "temperature": 1.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / ".cache/quickstart-model"))
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    rows = load_rows(ROOT / "data/quickstart_multiturn/train.jsonl")[:16]
    for row in rows:
        row["agent_cfg_path"] = str(ROOT / row["agent_cfg_path"])
    engine = TransformersEngine(args.model)
    manager = RolloutManager([engine], AutoTokenizer.from_pretrained(args.model), check_template_drift=False)
    manager.generate(rows, 8, PARAMS)  # warm-up: graphs built, caches filled
    times: dict[str, list[tuple[float, float]]] = {"gc as it comes": [], "setup frozen": []}
    for _ in range(args.rounds):
        for mode, seconds in times.items():
            if mode == "setup frozen":
                gc.collect()
                gc.freeze()
            busy, start = engine.busy_seconds, time.perf_counter()
            manager.generate(rows, 8, PARAMS)
            seconds.append((time.perf_counter() - start, engine.busy_seconds - busy))
            gc.unfreeze()
    engine.shutdown()
    for mode, seconds in times.items():
        total = statistics.median(s for s, _ in seconds)
        busy = statistics.median(b for _, b in seconds)
        print(f"{mode:>15}: rollout {total:.3f} s (median of {len(seconds)}), engine compute {busy:.3f} s")
    ratio = statistics.median(s for s, _ in times["setup frozen"]) / statistics.median(
        s for s, _ in times["gc as it comes"]
    )
    print(f"frozen / as it comes: {ratio:.2f}x")


if __name__ == "__main__":
    main()
