"""Write the multi-turn quickstart's bundled task: guess a hidden digit with higher/lower feedback.

    python data/quickstart_multiturn/make_data.py   # rewrites train.jsonl and val.jsonl beside this file

Each row routes to the ``guess_digit`` agent and carries its hidden digit as the extra field ``secret``, which
reaches the agent's ``run(secret=...)``. The agent scores itself, so rows need no ground truth.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def row(secret: int) -> dict:
    return {
        "data_source": "guess_digit",
        "agent_name": "guess_digit",
        "agent_cfg_path": "configs/agents/guess_digit.yaml",
        "prompt": [{"role": "user", "content": "guess"}],
        "secret": secret,
    }


def main() -> None:
    rng = random.Random(0)
    train = [row(rng.randrange(10)) for _ in range(1024)]
    val = [row(secret) for secret in range(10)]
    for name, rows in (("train.jsonl", train), ("val.jsonl", val)):
        with open(HERE / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        print(f"wrote {len(rows)} rows to {HERE / name}")


if __name__ == "__main__":
    main()
