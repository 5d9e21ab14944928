"""lit-agentrl vs TRL's ``GRPOTrainer`` and vs the compute floor: the same GRPO work, seconds per step.

Both sides train one locally built Qwen3 (2.5M parameters: hidden 256 x 4 layers, BPE tokenizer with a
ChatML template, ``benchmarks/shared.py``) on
the same 64 synthetic chat prompts: 8 prompts x 8 samples per step, up to 64 new tokens, temperature 1,
one optimizer step per rollout, no KL (TRL ``beta=0.0``), the same learning rate (constant, AdamW,
gradient clipping 1.0), a length reward computed by the same function, ``OMP_NUM_THREADS`` equal, CPU.

Scenarios:
  uniform   every completion runs to 64 tokens (ours: ``ignore_eos``; TRL: ``min_new_tokens=64``, which
            masks the EOS logit);
  variable  completions end on a fixed set of stop token ids (plus ``<|im_end|>``), so lengths vary widely
            (ours: ``stop_token_ids``; TRL: the model's ``generation_config.eos_token_id``).

Each side runs in its own subprocess, interleaved A B C over ``--rounds`` rounds: A is ours
(``lit-agentrl fit --config <generated yaml>`` with the ``single_turn`` agent), B is TRL (this file with
``--worker trl``), C is the compute floor of A's own steps (``compute_floor.py``: one batched generation of
exactly the token counts each step produced, one forward/backward/AdamW over exactly its tokens, no padding).
A wall clock is taken at the end of every step (ours: a Lightning callback; TRL: a ``TrainerCallback`` at
``on_step_end``); the first ``--warmup`` steps of every run are dropped. Reported: median seconds per step,
ours / TRL and ours / floor, and our per-step breakdown from the CSV metrics: rollout (engine compute, and
the rest: agents, rewards, scheduling), forward (log-probs and loss), backward, optimizer, weight sync, and
other (the wall time left over) as a fraction of the step.

Our sides: ``ours`` (sync, the engine's old log-probs), ``ours_trainer`` (sync, the trainer's: the loss the async
sides train), ``ours_async`` (``async_rollouts: {ahead: 1}``, the engine on a thread of the trainer's process) and
``ours_async_process`` (the same with ``engine: transformers_process``: the engine in a process of its own, one torch
thread there, so generation overlaps training without sharing the trainer's interpreter lock; it is the one side
that uses a second core). ``--sides`` picks a subset.

    pip install torch==2.13.0 -e ".[bench]"   # TRL 1.16 (CPU, no vLLM); leaves the other versions as they are
    python benchmarks/vs_trl.py --threads 1
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from compute_floor import measure as measure_floor
from shared import SHARED_MODEL

from lit_agentrl.config.run_file import cpu_run, write_config
from lit_agentrl.rewards import register_reward

REWARD_NAME = "vs_trl_length"
N_PROMPTS = 64
PROMPTS_PER_STEP = 8
N_SAMPLES = 8
NEW_TOKENS = 64
STOP_EVERY = 24
ENGINE_PROCESS = {"engine": {"name": "transformers_process", "kwargs": {"threads": 1}}}
"""The async side whose engine runs in a process of its own: one torch thread there, beside the trainer's own."""
"""Variable lengths: every ``STOP_EVERY``-th token id (from 10) stops a completion, about 4% of a random
model's draws, so lengths spread from 1 to 64 (about a third still reach 64)."""


@register_reward(REWARD_NAME)
def length_reward(completion: str, ground_truth: Any = None, **_: Any) -> float:
    """The trivial reward both sides use: completion length in characters, specials stripped, capped at 1."""
    text = completion.replace("<|im_end|>", "").replace("<|endoftext|>", "")
    return min(len(text), 200) / 200.0


def make_prompts(n: int = N_PROMPTS) -> list[str]:
    """Short, deterministic chat prompts (the same text for both sides)."""
    return [f"What is {a} + {b}? Answer briefly." for a, b in ((i * 7 % 50, i * 13 % 40 + 1) for i in range(n))]


def stop_ids(vocab_size: int, eos_id: int) -> list[int]:
    return [t for t in range(10, vocab_size, STOP_EVERY) if t != eos_id]


# --------------------------------------------------------------------------------------------------- clocks
def _lightning_clock():
    from lightning.pytorch.callbacks import Callback

    class StepClock(Callback):
        """Records the wall-clock time at the start of training and at the end of every step, and every step's
        trajectories (prompt and token ids) for the compute floor; writes both to ``out`` and ``steps`` at the
        end, so no file I/O lands inside a timed step."""

        def __init__(self, out: str, steps: str) -> None:
            self.out, self.steps, self.times, self.records = out, steps, [], []

        def on_train_start(self, trainer, pl_module) -> None:
            self.times = [time.perf_counter()]

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.times.append(time.perf_counter())
            ok = [t for t in batch.rollout.trajectories if not t.failed]
            self.records.append({"prompt_ids": [t.prompt_ids for t in ok], "token_ids": [t.all_token_ids for t in ok]})

        def on_train_end(self, trainer, pl_module) -> None:
            Path(self.out).write_text(json.dumps(self.times))
            Path(self.steps).write_text("".join(json.dumps(record) + "\n" for record in self.records))

    return StepClock


StepClock = _lightning_clock()


# ------------------------------------------------------------------------------------------------- workers
def run_ours(
    model_dir: Path, work: Path, scenario: str, steps: int, lr: float, seed: int, clock: Path, side: str
) -> Path:
    """The config of one of our sides: ``ours`` (sync, the engine's old log-probs), ``ours_trainer`` (the trainer's),
    ``ours_async`` (one step ahead, ``async_rollouts: {ahead: 1}``, with the off-policy correction it needs) or
    ``ours_async_process`` (the same with the engine in a process of its own, ``engine: transformers_process``)."""
    asynchronous = side in ("ours_async", "ours_async_process")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [
        {
            "data_source": REWARD_NAME,
            "agent_name": "single_turn",
            "prompt": [{"role": "user", "content": p}],
            "ground_truth": "-",
        }
        for p in make_prompts()
    ]
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sampling: dict[str, Any] = {"max_new_tokens": NEW_TOKENS, "temperature": 1.0}
    if scenario == "uniform":
        sampling["ignore_eos"] = True
    else:
        sampling["stop_token_ids"] = stop_ids(len(tok), tok.eos_token_id)
    config = cpu_run(
        model_dir,
        work,
        max_steps=steps,
        seed=seed,
        rollout={
            "train": {"n_samples": N_SAMPLES, "sampling_params": sampling},
            "health": {"template_drift": False},
            "async_rollouts": {"ahead": 1} if asynchronous else None,
            **(ENGINE_PROCESS if side == "ours_async_process" else {}),
        },
        model={
            "optimizer": {"lr": lr, "grad_clip": 1.0},
            "loss": {"kl_coef": 0.0, "old_logprobs": "engine" if side == "ours" else "trainer"},
            "correction": {"kind": "tis"} if asynchronous else None,
        },
        data={
            "train_files": str(data),
            "prompts_per_step": PROMPTS_PER_STEP,
            "agent_modules": ["vs_trl"],
            "seed": seed,
        },
        callbacks=[
            {"class_path": "vs_trl.StepClock", "init_args": {"out": str(clock), "steps": str(work / "steps.jsonl")}}
        ],
    )
    return write_config(config, work / "config.yaml")


def trl_worker(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    generation_kwargs: dict[str, Any] = {}
    if args.scenario == "uniform":
        generation_kwargs["min_new_tokens"] = NEW_TOKENS  # EOS logits masked: every completion is 64 tokens
    else:
        # GRPOTrainer reads its stop set (for generate and for masking) from the model's generation config.
        model.generation_config.eos_token_id = [tok.eos_token_id, *stop_ids(len(tok), tok.eos_token_id)]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in make_prompts()])

    def reward(completions, **_):
        return [length_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            times.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter())
            Path(args.clock).write_text(json.dumps(times))

    config = GRPOConfig(
        output_dir=args.work,
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=args.seed,
        per_device_train_batch_size=PROMPTS_PER_STEP * N_SAMPLES,  # counts completions
        num_generations=N_SAMPLES,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        generation_kwargs=generation_kwargs or None,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tok, callbacks=[Clock()]
    )
    trainer.train()
    lengths = [h.get("completions/mean_length") for h in trainer.state.log_history if "completions/mean_length" in h]
    Path(args.work, "lengths.json").write_text(json.dumps(lengths))


# ----------------------------------------------------------------------------------------------- driver
def step_seconds(clock: Path, warmup: int) -> list[float]:
    times = json.loads(clock.read_text())
    return [b - a for a, b in itertools.pairwise(times)][warmup:]


BREAKDOWN = {  # our per-step phases: CSV metric(s)
    "generation": ("time/generation_s",),
    "reward": ("time/reward_s",),
    "agents": ("time/rollout_s", "-time/generation_s", "-time/reward_s"),
    "forward": ("time/forward_s",),
    "backward": ("time/backward_s",),
    "optimizer": ("time/optimizer_s",),
    "sync": ("time/sync_s",),
}


def our_breakdown(work: Path, walls: list[float], warmup: int) -> dict[str, list[float]]:
    """Per measured step, seconds of each phase in :data:`BREAKDOWN`, and other = the wall time left over."""
    path = next(work.glob("logs/csv/version_*/metrics.csv"))
    by_step: dict[int, dict[str, float]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            entry = by_step.setdefault(int(row["step"]), {})
            entry.update(
                {k: float(v) for k, v in row.items() if v and (k.startswith("time/") or k.startswith("rollout/"))}
            )
    steps = [by_step[k] for k in sorted(by_step)][warmup : warmup + len(walls)]
    out: dict[str, list[float]] = {key: [] for key in [*BREAKDOWN, "other", "length"]}
    for wall, metrics in zip(walls, steps):
        for key, terms in BREAKDOWN.items():
            out[key].append(sum(-metrics[t[1:]] if t[0] == "-" else metrics[t] for t in terms))
        out["other"].append(wall - sum(out[key][-1] for key in BREAKDOWN))
        out["length"].append(metrics["rollout/response_length_mean"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first --warmup are dropped)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="A B C rounds per scenario")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for every side")
    parser.add_argument("--scenarios", default="uniform,variable")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-trl", action="store_true", help="only ours and the floor (no TRL installed)")
    parser.add_argument("--sides", default=None, help="a comma-separated subset of the sides to run (default: all)")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--worker", choices=["trl", "floor"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--clock", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "trl":
        trl_worker(args)
        return
    if args.worker == "floor":  # in its own process, like the other two sides
        floors = measure_floor(args.model, str(Path(args.work, "steps.jsonl")), args.threads, args.lr)
        Path(args.clock).write_text(json.dumps(floors[args.warmup :]))
        return

    from lit_agentrl.models.tiny import save_tiny_model

    root = Path(args.workdir or tempfile.mkdtemp(prefix="vs_trl-"))
    model_dir = save_tiny_model(root / "model", SHARED_MODEL)
    here = Path(__file__).resolve().parent
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.threads),
        MKL_NUM_THREADS=str(args.threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")])),
    )
    cli = (
        [shutil.which("lit-agentrl")]
        if shutil.which("lit-agentrl")
        else [sys.executable, "-c", "from lit_agentrl.cli import main; main()"]
    )
    # "ours_trainer": ours with model.old_logprobs: trainer (from the update's own forward: one mini-batch);
    # "ours_async": the next step's rollout while this one trains (RolloutCallback async_rollouts: {ahead: 1});
    # "ours_async_process": the same with the engine in a process of its own (engine: transformers_process).
    ours_sides = ("ours", "ours_trainer", "ours_async", "ours_async_process")
    sides = (*ours_sides, "floor") if args.no_trl else (*ours_sides, "trl", "floor")
    if args.sides:
        chosen = [s.strip() for s in args.sides.split(",") if s.strip()]
        unknown = sorted(set(chosen) - set(sides))
        if unknown or ("floor" in chosen and "ours" not in chosen):
            sys.exit(f"--sides: {unknown or 'floor needs ours'}; valid: {', '.join(sides)}")
        sides = tuple(s for s in sides if s in chosen)
    results: dict[str, dict[str, Any]] = {}
    for scenario in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
        res = results[scenario] = {
            "ours": [],
            "ours_trainer": [],
            "ours_async": [],
            "ours_async_process": [],
            "trl": [],
            "floor": [],
            "trl_length": [],
            "floor_parts": [],
            "breakdown": {k: [] for k in [*BREAKDOWN, "other", "length"]},
        }
        for rnd in range(args.rounds):
            for side in sides:
                work = root / f"{scenario}-{'ours' if side == 'floor' else side}-{rnd}"  # the floor reads ours' steps
                work.mkdir(parents=True, exist_ok=True)
                clock = work / ("floor.json" if side == "floor" else "clock.json")
                if side in ours_sides:
                    config = run_ours(model_dir, work, scenario, args.steps, args.lr, args.seed + rnd, clock, side)
                    cmd = [*cli, "fit", "--config", str(config)]
                else:
                    cmd = [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--worker",
                        side,
                        "--model",
                        str(model_dir),
                        "--scenario",
                        scenario,
                        "--work",
                        str(work),
                        "--clock",
                        str(clock),
                        "--steps",
                        str(args.steps),
                        "--threads",
                        str(args.threads),
                        "--lr",
                        str(args.lr),
                        "--seed",
                        str(args.seed + rnd),
                        "--warmup",
                        str(args.warmup),
                    ]
                start = time.perf_counter()
                proc = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"{side} ({scenario}, round {rnd}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
                if side == "floor":
                    floors = json.loads(clock.read_text())
                    walls = [f["total"] for f in floors]
                    res["floor_parts"] += floors
                else:
                    walls = step_seconds(clock, args.warmup)
                res[side] += walls
                if side == "ours":
                    for k, v in our_breakdown(work, walls, args.warmup).items():
                        res["breakdown"][k] += v
                elif side == "trl":
                    res["trl_length"] += json.loads((work / "lengths.json").read_text())[args.warmup :]
                print(
                    f"[{scenario} round {rnd}] {side}: {len(walls)} steps, median {statistics.median(walls):.2f} s/step "
                    f"(process {time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
    (root / "results.json").write_text(json.dumps(results))  # a crash in the report loses no run
    report(results, args)
    print(f"scratch: {root}")


def med(values: list[float]) -> float:
    """The median, or NaN for a side that did not run."""
    return statistics.median(values) if values else float("nan")


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the tables the sides that ran allow (``--sides`` may have run a subset)."""

    def ran(*sides: str) -> bool:
        return all(res[side] for res in results.values() for side in sides)

    print(
        f"\nthreads={args.threads}, {PROMPTS_PER_STEP} prompts x {N_SAMPLES} samples, <= {NEW_TOKENS} new tokens, "
        f"warm-up {args.warmup} of {args.steps} steps dropped per run, {args.rounds} rounds; median s/step"
    )
    if ran("ours"):
        report_ours(results)
    if ran("ours", "ours_trainer"):
        print("\nold log-probs (median s/step): the engine's own vs the trainer's (model.old_logprobs: trainer)")
        for scenario, res in results.items():
            ours, trainer = med(res["ours"]), med(res["ours_trainer"])
            print(f"{scenario:<9} engine {ours:>6.2f}  trainer {trainer:>6.2f}  trainer/engine {trainer / ours:>5.2f}")
    if ran("ours_trainer") and (ran("ours_async") or ran("ours_async_process")):
        print(
            "\nasync (median s/step): the next step's rollout while this one trains (async_rollouts: {ahead: 1}, "
            "with the trainer's old log-probs and TIS), against sync with the same loss, sync with the engine's "
            "old log-probs and TRL"
        )
        for scenario, res in results.items():
            sync, engine, trl = med(res["ours_trainer"]), med(res["ours"]), med(res["trl"])
            for name, side in (("async", "ours_async"), ("async, engine process", "ours_async_process")):
                if res[side]:
                    ahead = med(res[side])
                    print(
                        f"{scenario:<9} {name:<22} async {ahead:>5.2f}  sync {sync:>5.2f} (x{ahead / sync:.2f})  "
                        f"sync engine {engine:>5.2f} (x{ahead / engine:.2f})  TRL {trl:>5.2f} (x{ahead / trl:.2f})"
                    )
        print(
            "(the engine process uses a second core beside the trainer's; every other side runs in one process with "
            "--threads torch threads)"
        )


def report_ours(results: dict[str, dict[str, Any]]) -> None:
    """Ours (sync, the engine's log-probs) against TRL and the floor, and its per-step breakdown."""
    print(
        f"{'scenario':<9} {'ours':>6} {'TRL':>6} {'floor':>6} {'ours/TRL':>9} {'ours/floor':>11} {'steps':>9} "
        f"{'tokens ours/TRL':>16}"
    )
    for scenario, res in results.items():
        ours, trl, floor = med(res["ours"]), med(res["trl"]), med(res["floor"])
        lengths = f"{statistics.fmean(res['breakdown']['length']):.1f}/" + (
            f"{statistics.fmean(res['trl_length']):.1f}" if res["trl_length"] else "-"
        )
        print(
            f"{scenario:<9} {ours:>6.2f} {trl:>6.2f} {floor:>6.2f} {ours / trl:>9.2f} {ours / floor:>11.2f} "
            f"{len(res['ours']):>3}/{len(res['trl'])}/{len(res['floor'])} {lengths:>16}"
        )
    print(
        "\nours, per step (median s): rollout = generation (engine compute) + reward + agents (graphs, templates, scheduling)"
    )
    print(f"{'scenario':<9} " + " ".join(f"{k:>10}" for k in [*BREAKDOWN, "other", "other %"]))
    for scenario, res in results.items():
        b = {k: med(v) for k, v in res["breakdown"].items()}
        share = med([o / w for o, w in zip(res["breakdown"]["other"], res["ours"])]) * 100
        print(f"{scenario:<9} " + " ".join(f"{b[k]:>10.3f}" for k in [*BREAKDOWN, "other"]) + f" {share:>9.1f}%")
        floor = {k: med([f[k] for f in res["floor_parts"]]) for k in ("generation", "forward", "backward", "optimizer")}
        print(f"{'  floor':<9} " + " ".join(f"{floor.get(k, float('nan')):>10.3f}" for k in BREAKDOWN))


if __name__ == "__main__":
    main()
