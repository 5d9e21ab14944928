"""Write the quickstart's bundled task: ``a =`` -> ``(a + 1) % 10``, routed like MATH rows.

    python data/quickstart/make_data.py   # rewrites train.jsonl and val.jsonl beside this file
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def row(a: int) -> dict:
    return {
        "data_source": "next_digit",
        "agent_name": "single_turn",
        "agent_cfg_path": "configs/agents/single_turn.yaml",
        "prompt": [{"role": "user", "content": f"{a} ="}],
        "reward_model": {"style": "rule", "ground_truth": str((a + 1) % 10)},
        "extra_info": {"a": a},
    }


def main() -> None:
    rng = random.Random(0)
    train = [row(rng.randrange(10)) for _ in range(1024)]
    val = [row(a) for a in range(10)]
    for name, rows in (("train.jsonl", train), ("val.jsonl", val)):
        with open(HERE / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        print(f"wrote {len(rows)} rows to {HERE / name}")


if __name__ == "__main__":
    main()
