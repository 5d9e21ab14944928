"""Generation on cores of its own, one step ahead, against generation and training taking turns (issue 42), on CPU,
side by side in one run.

The single-turn quickstart's task on the benchmarks' shared 2.5M-parameter model, trained by ``lit-agentrl fit``
against one real SGLang server behind SGLang's router, weights over a gloo group after every step:

- ``colocated, synchronous``: the server and the trainer share both cores (two threads each) and take turns, as a
  colocated engine does;
- ``split, synchronous``: the server on core 1 and the trainer on core 0 (one thread each), still taking turns; its
  mean rollout and update seconds give the overlap floor, max(generation, training) per step;
- ``split, one step ahead``: the same split with ``async_rollouts: {ahead: 1, partial: true}``.

Reported: the mean step seconds after the first ``--warmup`` steps, and each against the colocated one and the
floor. Runs in the SGLang environment, with SGLang's router built by ``scripts/build_router_env.sh``::

    PY="$(scripts/build_sglang_env.sh)"
    SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tests/sglang_shim:benchmarks "$PY" benchmarks/disaggregated.py --out /tmp/disagg
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

from shared import SHARED_MODEL

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from support import SGLANG_SHIM, sglang_server, smg_router  # noqa: E402

from lit_agentrl.config.run_file import cpu_run, write_config  # noqa: E402
from lit_agentrl.models.tiny import save_tiny_model  # noqa: E402

LAYOUTS = {  # name -> (server cores, trainer cores, threads each, async_rollouts)
    "colocated, synchronous": ("0,1", "0,1", 2, None),
    "split, synchronous": ("1", "0", 1, None),
    "split, one step ahead": ("1", "0", 1, {"ahead": 1, "partial": True}),
}


def fit(out: Path, name: str, model: Path, router_url: str, steps: int, layout: tuple) -> Path:
    """One ``lit-agentrl fit`` pinned to the layout's trainer cores; its metrics.csv."""
    _, cores, threads, ahead = layout
    folder = out / name.replace(", ", "_").replace(" ", "-")
    folder.mkdir(parents=True, exist_ok=True)
    engine = {"router_url": router_url, "transport": "collective", "collective_backend": "gloo"}
    rollout = {
        "engine": {"name": "sglang_router", "kwargs": engine},
        "train": {"n_samples": 8, "sampling_params": {"max_new_tokens": 32, "temperature": 1.0}},
        "validation": {"sampling_params": {"max_new_tokens": 4, "temperature": 0.0}},
    }
    if ahead:
        rollout["async_rollouts"] = ahead
    model_settings = {"optimizer": {"lr": 5.0e-4}}
    if ahead:
        model_settings.update(loss={"old_logprobs": "trainer"}, correction={"kind": "tis"})
    data = {
        "train_files": str(REPO / "data/quickstart/train.jsonl"),
        "val_files": str(REPO / "data/quickstart/val.jsonl"),
        "prompts_per_step": 16,
        "val_prompts_per_step": 10,
    }
    config = cpu_run(model, folder, max_steps=steps, rollout=rollout, data=data, model=model_settings)
    config["trainer"]["limit_val_batches"] = 0
    path = write_config(config, folder / "config.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    command = ["taskset", "-c", cores, sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(path)]
    with (folder / "fit.log").open("w") as log:
        subprocess.run(command, check=True, env=env, cwd=folder, stdout=log, stderr=log)
    return next(folder.rglob("metrics.csv"))


def column(metrics: Path, key: str, warmup: int) -> list[float]:
    with metrics.open() as f:
        values = [float(row[key]) for row in csv.DictReader(f) if row.get(key) not in (None, "")]
    return values[warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    args.out = args.out.resolve()
    model = save_tiny_model(args.out / "model", SHARED_MODEL)
    steps: dict[str, float] = {}
    floor = 0.0
    for name, layout in LAYOUTS.items():
        server_cores, _, threads, _ = layout
        os.environ.update(OMP_NUM_THREADS=str(threads), SGLANG_USE_CPU_ENGINE="1")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(SGLANG_SHIM), str(REPO)])
        with ExitStack() as stack:
            url, server = stack.enter_context(sglang_server(model))
            subprocess.run(
                ["taskset", "-a", "-p", "-c", server_cores, str(server.pid)], check=True, capture_output=True
            )
            for child in _children(server.pid):  # the scheduler and detokenizer processes too
                subprocess.run(["taskset", "-a", "-p", "-c", server_cores, str(child)], check=True, capture_output=True)
            router_url = stack.enter_context(smg_router([url]))
            metrics = fit(args.out, name, model, router_url, args.steps, layout)
        steps[name] = statistics.fmean(column(metrics, "time/step_s", args.warmup))
        if name == "split, synchronous":
            rollout = statistics.fmean(column(metrics, "time/rollout_s", args.warmup))
            train = statistics.fmean(column(metrics, "time/train_s", args.warmup))
            floor = max(rollout, train)
            print(f"split, synchronous: rollout {rollout:.3f} s, update {train:.3f} s per step")
    base = steps["colocated, synchronous"]
    print(f"| layout | step s | vs colocated | vs the floor max(generation, training) = {floor:.3f} s |")
    print("|---|---|---|---|")
    for name, value in steps.items():
        print(f"| {name} | {value:.3f} | {base / value:.2f}x | {value / floor:.2f}x the floor |")


def _children(pid: int) -> list[int]:
    import psutil

    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


if __name__ == "__main__":
    main()
