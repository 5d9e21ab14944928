"""Write the vision quickstart's task: name the colour of a square in a generated image.

    python data/quickstart_vision/make_data.py   # rewrites train.jsonl and val.jsonl here

Each row is routed to the ``colour_name`` agent (``lit_agentrl/agents/vision_toy.py``) and carries the square's
``colour`` and a ``seed`` for its place and size; the agent draws the image from them, so no image files are
stored. The agent scores itself, so the rows need no ground truth.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLOURS = ("red", "green", "blue", "yellow")  # lit_agentrl.agents.vision_toy.COLOURS


def colour_row(colour: str, seed: int) -> dict:
    return {
        "data_source": "colour_name",
        "agent_name": "colour_name",
        "agent_cfg_path": "configs/agents/colour_name.yaml",
        "prompt": [{"role": "user", "content": "what colour is the square?"}],
        "colour": colour,
        "seed": seed,
    }


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    rng = random.Random(0)
    train = [colour_row(rng.choice(COLOURS), rng.randrange(10**6)) for _ in range(1024)]
    val = [colour_row(colour, 10**6 + i) for i in range(5) for colour in COLOURS]
    write(HERE / "train.jsonl", train)
    write(HERE / "val.jsonl", val)


if __name__ == "__main__":
    main()
