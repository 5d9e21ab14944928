"""Write rows that play one of TextArena's games, one seed (one episode) per row: ``train.jsonl`` and ``val.jsonl``.

Usage:
    python data/prepare_textarena.py --env_id GuessTheNumber-v0 --local_dir DIR [--env_kwargs '{"max_turns": 5}'] \
        [--num_players 1] [--player 0] [--train_size 1000] [--val_size 50] [--seed 0] \
        [--prompt "TEXT"] [--agent_cfg_path configs/agents/textarena.yaml]

Training rows take the seeds ``seed .. seed + train_size - 1``, validation rows the next ``val_size`` seeds, so no
validation game is a training game. Each row::

    {"agent_name": "textarena", "agent_cfg_path": ..., "prompt": [{"role": "user", "content": PROMPT}],
     "env_id": "GuessTheNumber-v0", "seed": 17, "num_players": 1, "player": 0, "env_kwargs": {...}}

played by the ``textarena`` agent (lit_agentrl/agents/libraries/textarena.py; its YAML names the opponent of a
two-player game). Needs ``pip install 'lit-agentrl[textarena]'`` only to train, not to write the rows.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

DEFAULT_PROMPT = "You are playing a game. Each of your turns is one move, in the format the game asks for."


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env_id", required=True)
    parser.add_argument("--local_dir", required=True, type=Path)
    parser.add_argument("--env_kwargs", default="{}", help="the game's own arguments, as JSON")
    parser.add_argument("--num_players", type=int, default=1)
    parser.add_argument("--player", type=int, default=0)
    parser.add_argument("--train_size", type=int, default=1000)
    parser.add_argument("--val_size", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--agent_cfg_path", default="configs/agents/textarena.yaml")
    args = parser.parse_args(argv)
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: --env_kwargs is not JSON ({exc}): {args.env_kwargs!r}") from exc
    args.local_dir.mkdir(parents=True, exist_ok=True)
    first_val = args.seed + args.train_size
    for split, seeds in (("train", range(args.seed, first_val)), ("val", range(first_val, first_val + args.val_size))):
        rows = [
            {
                "agent_name": "textarena",
                "agent_cfg_path": args.agent_cfg_path,
                "prompt": [{"role": "user", "content": args.prompt}],
                "env_id": args.env_id,
                "seed": seed,
                "num_players": args.num_players,
                "player": args.player,
                "env_kwargs": env_kwargs,
            }
            for seed in seeds
        ]
        path = args.local_dir / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {len(rows)} games of {args.env_id} to {path}")


if __name__ == "__main__":
    main()
