"""The price of deterministic admission (engines.admission): the quickstart's rollouts (16 prompts x 8 samples) through
the rollout manager with the transformers engine admitting by arrival and deterministically, alternated in one run.
Reports the median seconds per rollout of each and their ratio, for both quickstart tasks.

    python -m lit_agentrl.models.tiny --tokenizer words --out .cache/quickstart-model
    python benchmarks/deterministic_rollouts.py --rounds 6
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from transformers import AutoTokenizer

import lit_agentrl.agents  # noqa: F401  registers the quickstarts' agents
from lit_agentrl.data import load_rows
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.rollout.manager import RolloutManager

ROOT = Path(__file__).resolve().parents[1]
TASKS = {
    "quickstart": {"max_new_tokens": 8, "temperature": 1.0},
    "quickstart_multiturn": {"max_new_tokens": 1, "temperature": 1.0},
}


def rows_of(task: str) -> list[dict]:
    rows = load_rows(ROOT / f"data/{task}/train.jsonl")[:16]
    for row in rows:
        if row.get("agent_cfg_path"):
            row["agent_cfg_path"] = str(ROOT / row["agent_cfg_path"])
    return rows


def median_seconds(model: str, task: str, rounds: int) -> dict[bool, float]:
    tokenizer = AutoTokenizer.from_pretrained(model)
    engines = {mode: TransformersEngine(model, deterministic=mode) for mode in (False, True)}
    managers = {mode: RolloutManager([e], tokenizer, check_template_drift=False) for mode, e in engines.items()}
    rows, params = rows_of(task), TASKS[task]
    times: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(rounds + 1):  # the first round warms up (graphs built, caches filled)
        for mode, manager in managers.items():
            engines[mode].reseed(round_)
            start = time.perf_counter()
            batch = manager.generate(rows, 8, params)
            assert batch.stats.num_failed == 0, batch.stats.failure_reasons
            if round_:
                times[mode].append(time.perf_counter() - start)
    for mode, manager in managers.items():
        manager.close()
        engines[mode].shutdown()
    return {mode: statistics.median(seconds) for mode, seconds in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / ".cache/quickstart-model"))
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    for task in TASKS:
        median = median_seconds(args.model, task, args.rounds)
        print(
            f"{task:>22}: by arrival {median[False]:.3f} s, deterministic {median[True]:.3f} s "
            f"(median of {args.rounds}): {median[True] / median[False]:.2f}x"
        )


if __name__ == "__main__":
    main()
