"""Write rows that roll out a verifiers taskset's tasks, one task per row: ``train.jsonl`` and ``val.jsonl``.

Usage:
    python data/prepare_verifiers.py --taskset '{"id": "textarena", "game": "Hangman-v0"}' --local_dir DIR \
        [--train_size 1000] [--val_size 50] [--agent_cfg_path configs/agents/verifiers.yaml]

The taskset is loaded in verifiers' venv (``scripts/build_verifiers_env.sh``): training rows are its tasks
``0 .. train_size - 1``, validation rows the next ``val_size`` (fewer when the taskset has fewer). Each row::

    {"agent_name": "verifiers", "agent_cfg_path": ..., "prompt": [<the task's opening messages>],
     "taskset": {"id": "textarena", "game": "Hangman-v0"}, "task_index": 17}

rolled out by the ``verifiers`` agent (lit_agentrl/agents/libraries/verifiers.py); the prompt is what verifiers
opens the conversation with, so the data's prompt-length check measures the real one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from lit_agentrl.agents.libraries.verifiers import episode_command


def task_prompts(taskset: dict, count: int) -> list[list[dict]]:
    """The opening messages of the taskset's first ``count`` tasks, listed by verifiers in its venv."""
    request = json.dumps({"taskset": taskset, "list": count})
    done = subprocess.run(episode_command(), input=request.encode(), capture_output=True, check=False, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"error: verifiers could not list the taskset {taskset}: {done.stderr.decode()[-2000:]}")
    return [task["prompt"] for task in json.loads(done.stdout.decode().strip().splitlines()[-1])["tasks"]]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--taskset", required=True, help="the taskset's config as JSON, with its id")
    parser.add_argument("--local_dir", required=True, type=Path)
    parser.add_argument("--train_size", type=int, default=1000)
    parser.add_argument("--val_size", type=int, default=50)
    parser.add_argument("--agent_cfg_path", default="configs/agents/verifiers.yaml")
    args = parser.parse_args(argv)
    try:
        taskset = json.loads(args.taskset)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: --taskset is not JSON ({exc}): {args.taskset!r}") from exc
    if not isinstance(taskset, dict) or not isinstance(taskset.get("id"), str):
        raise SystemExit(f"error: --taskset must be a JSON object with a string 'id', got {args.taskset!r}")
    prompts = task_prompts(taskset, args.train_size + args.val_size)
    if not prompts:
        raise SystemExit(f"error: the taskset {taskset} has no task")
    args.local_dir.mkdir(parents=True, exist_ok=True)
    splits = {"train": range(min(args.train_size, len(prompts))), "val": range(args.train_size, len(prompts))}
    for split, indices in splits.items():
        rows = [
            {
                "agent_name": "verifiers",
                "agent_cfg_path": args.agent_cfg_path,
                "prompt": prompts[i],
                "taskset": taskset,
                "task_index": i,
            }
            for i in indices
        ]
        path = args.local_dir / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {len(rows)} tasks of the verifiers taskset {taskset['id']} to {path}")


if __name__ == "__main__":
    main()
