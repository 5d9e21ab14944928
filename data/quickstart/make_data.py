"""Write the quickstarts' bundled tasks, routed like MATH rows.

    python data/quickstart/make_data.py   # rewrites train.jsonl and val.jsonl here and in ../quickstart_multiturn

- ``quickstart/``: ``a =`` -> ``(a + 1) % 10`` through the ``single_turn`` agent, scored by ``next_digit``.
- ``quickstart_multiturn/``: guess a hidden digit with higher/lower answers through the ``guess_digit`` agent; the
  digit is the extra field ``secret``, which reaches the agent's ``run(secret=...)``. The agent scores itself, so
  these rows need no ground truth.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent


def next_digit_row(a: int) -> dict:
    return {
        "data_source": "next_digit",
        "agent_name": "single_turn",
        "agent_cfg_path": "configs/agents/single_turn.yaml",
        "prompt": [{"role": "user", "content": f"{a} ="}],
        "reward_model": {"style": "rule", "ground_truth": str((a + 1) % 10)},
        "extra_info": {"a": a},
    }


def guess_digit_row(secret: int) -> dict:
    return {
        "data_source": "guess_digit",
        "agent_name": "guess_digit",
        "agent_cfg_path": "configs/agents/guess_digit.yaml",
        "prompt": [{"role": "user", "content": "guess"}],
        "secret": secret,
    }


def write_task(folder: str, row: Callable[[int], dict]) -> None:
    """1024 training rows of random digits and one validation row per digit."""
    rng = random.Random(0)
    train = [row(rng.randrange(10)) for _ in range(1024)]
    val = [row(digit) for digit in range(10)]
    for name, rows in (("train.jsonl", train), ("val.jsonl", val)):
        path = DATA / folder / name
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    write_task("quickstart", next_digit_row)
    write_task("quickstart_multiturn", guess_digit_row)
