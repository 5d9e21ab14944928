"""Write reasoning-gym's procedural tasks as the project's rows (``train.jsonl`` and ``val.jsonl``).

Usage:
    python data/prepare_reasoning_gym.py --dataset count_bits --config '{"max_n": 15}' --local_dir DIR \
        [--train_size 2000] [--val_size 200] [--seed 1] [--system_prompt default|none|TEXT] [--answer_tag answer|none] \
        [--agent_name single_turn] [--agent_cfg_path PATH]

``--dataset`` is any name of ``reasoning_gym.factory.DATASETS`` (``composite`` too, with its ``datasets`` list in
``--config``), ``--config`` the dataset's own config fields as JSON. The validation split uses the seed
``--seed + 10**6``: reasoning-gym's entry ``i`` of seed ``s`` is entry ``i - 1`` of seed ``s + 1``, so nearby seeds
share their questions. ``--system_prompt`` is a key of ``reasoning_gym.utils.SYSTEM_PROMPTS`` (default: its
``default``, which asks for ``<answer>...</answer>``), ``none``, or the text itself; ``--answer_tag none`` scores the
whole completion (for a model that answers bare). Each row::

    {"data_source": "reasoning_gym", "agent_name": "single_turn", "prompt": [system, {"role": "user", ...}],
     "reward_model": {"style": "rule", "ground_truth": {"dataset", "config", "seed", "size", "index", "question",
                                                        "answer", "answer_tag"}}}

scored by the ``reasoning_gym`` reward (lit_agentrl/agents/libraries/reasoning_gym.py) with the dataset's own
``score_answer``. Needs ``pip install 'lit-agentrl[reasoning-gym]'``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from lit_agentrl.agents.libraries.imports import require
from lit_agentrl.agents.libraries.reasoning_gym import entry_rows

VAL_SEED_OFFSET = 10**6


def _system_prompt(value: str) -> str | None:
    if value == "none":
        return None
    prompts = require("reasoning_gym.utils", extra="reasoning-gym", user="prepare_reasoning_gym.py").SYSTEM_PROMPTS
    return prompts.get(value, value)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--config", default="{}", help="the dataset's config fields, as JSON")
    parser.add_argument("--local_dir", required=True, type=Path)
    parser.add_argument("--train_size", type=int, default=2000)
    parser.add_argument("--val_size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--system_prompt", default="default")
    parser.add_argument("--answer_tag", default="answer")
    parser.add_argument("--agent_name", default="single_turn")
    parser.add_argument("--agent_cfg_path", default=None)
    args = parser.parse_args(argv)
    try:
        config = json.loads(args.config)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: --config is not JSON ({exc}): {args.config!r}") from exc
    args.local_dir.mkdir(parents=True, exist_ok=True)
    for split, size, seed in (
        ("train", args.train_size, args.seed),
        ("val", args.val_size, args.seed + VAL_SEED_OFFSET),
    ):
        rows = entry_rows(
            args.dataset,
            config,
            seed,
            size,
            agent_name=args.agent_name,
            agent_cfg_path=args.agent_cfg_path,
            system_prompt=_system_prompt(args.system_prompt),
            answer_tag=None if args.answer_tag == "none" else args.answer_tag,
        )
        path = args.local_dir / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {len(rows)} rows of {args.dataset} (seed {seed}) to {path}")


if __name__ == "__main__":
    main()
