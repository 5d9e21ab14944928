"""Credit per turn on the sparse guessing game (issue 43): each advantage estimator, several seeds, side by side.

The multi-turn quickstart's game and settings (``configs/quickstart_multiturn.yaml``) with the reward made sparse: the
``guess_digit`` agent's ``feedback_credit`` set to 0, so a game scores 1 when a guess finds the digit and 0 otherwise.
Each run is a real ``lit-agentrl fit`` of that config with ``model.loss.advantage`` (and ``gamma``) set per
estimator; runs go two at a time, one thread each. It prints, per run and per estimator (mean over seeds), the
training reward and ``found_turn_2``/``found_turn_3`` (success on a turn among the games that reached it; blind play
0.11 and 0.125), the first fifth of the steps against the last, the spread of the advantages per turn index, and for
``gigpo`` the share of turns that found a partner in a step group; from the trajectory log, how often the second
guess stays inside the range the first answer left ("reads the answer", beside what a blind second guess would
score after the same first guesses: 0.5-0.6 from spread first guesses, more from an edge) and the commonest first
guesses at the end. ``gigpo_batch`` is GiGPO with ``model.loss.step_groups: batch`` (this game's rows share one
prompt, so contexts recur across prompt groups); ``turn_returns_gamma0`` is ``turn_returns`` with ``gamma: 0``.

    python benchmarks/credit_per_turn.py --out /tmp/credit --steps 800 --seeds 0 1 2

``--feedback-credit C`` gives the game back its shaped reward (the multi-turn quickstart's 0.5: C times the share of
digits the answers ruled out, per guess inside the range they left) and ``--turn-credit`` has the agent report that
credit per turn (``turn_rewards``) rather than summed into the outcome: the same reward per game, for the turn-level
estimators to credit to the turn that earned it.

``--samples-per-prompt N`` plays N games per prompt and 128 / N prompts a step (the same 128 games; more of a
group's turns then share their context with another's), and ``--fit-args`` adds options to every run's fit.

``--exact`` prints the game's exact win rates for policies that read the answers on turn 2, 3, both or neither, from a
uniform, an edge (1) or a middle (4) first guess: what each move is worth, computed, not trained.

Everything a run writes (the tiny model, the sparse agent config and data, the logs) goes under ``--out``; a run
whose ``metrics.csv`` is complete is not run again, so an interrupted sweep resumes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "quickstart_multiturn.yaml"
PAPER_GAMMA = ["--model.loss.gamma", "0.95"]
GAMMA0 = ["--model.loss.gamma", "0"]
BATCH_STEP_GROUPS = ["--model.loss.step_groups", "batch"]
ESTIMATORS = {
    "grpo": ["--model.loss.advantage", "grpo"],
    "gigpo": ["--model.loss.advantage", "gigpo", *PAPER_GAMMA],
    "gigpo_batch": ["--model.loss.advantage", "gigpo", *PAPER_GAMMA, *BATCH_STEP_GROUPS],
    "gigpo_batch_gamma0": ["--model.loss.advantage", "gigpo", *GAMMA0, *BATCH_STEP_GROUPS],
    "gigpo_batch_gamma0_no_first_step": [
        *("--model.loss.advantage", "gigpo", *GAMMA0, *BATCH_STEP_GROUPS, "--model.loss.step_first_turn", "false")
    ],
    "turn_returns": ["--model.loss.advantage", "turn_returns", *PAPER_GAMMA],
    "turn_returns_gamma0": ["--model.loss.advantage", "turn_returns", *GAMMA0],
    "gae": ["--model.loss.advantage", "gae", "--model.loss.gae_lambda", "0.5"],
    "gae_lambda0": ["--model.loss.advantage", "gae", "--model.loss.gae_lambda", "0"],
}
"""Run name -> its estimator's options: GiGPO's gamma for the turn-level ones, ``gigpo_batch`` GiGPO with step
groups over the whole batch (every row of this game has the same prompt), ``gigpo_batch_gamma0`` the same with each
turn's step return its own reward (the outcome still credits every turn through the episode advantage),
``gigpo_batch_gamma0_no_first_step`` the same without the first turn's step advantage (whether the first guess was the
secret: luck) and
``turn_returns_gamma0`` each turn credited with its own reward only (here: 1 on the turn that finds the digit, since the
game ends there); ``gae`` the learned critic with GAE's lambda 0.5 and ``gae_lambda0`` with lambda 0 (each turn
credited with the critic's one-step temporal difference: the fastest learner of ``credit_simulation.py``)."""
GAMES_PER_STEP = 128
"""The quickstart's 16 prompts x 8 samples."""
SERIES = ["rollout/reward_mean", "agent/guess_digit/found_turn_2", "agent/guess_digit/found_turn_3"]


def prepare(
    out: Path, samples_per_prompt: int, feedback_credit: float, turn_credit: bool
) -> tuple[Path, Path, Path, Path]:
    """The tiny model, the agent config (sparse unless ``feedback_credit``), the data rows pointing at it and the run
    config, under ``out``.

    The run config is the quickstart's with ``samples_per_prompt`` games per prompt and 128 / that many prompts a
    step, so every setting plays the same 128 games a step.
    """
    model = out / "model"
    if not (model / "config.json").exists():
        run([sys.executable, "-m", "lit_agentrl.models.tiny", "--tokenizer", "words", "--out", str(model)])
    agent_cfg = out / ("guess_digit_sparse.yaml" if not feedback_credit else "guess_digit_shaped.yaml")
    agent_cfg.write_text(
        f"max_guesses: 3\nfeedback_credit: {feedback_credit}  # 0: found only, the sparse reward\n"
        f"turn_credit: {str(turn_credit).lower()}\n"
    )
    files = []
    for split in ("train", "val"):
        rows = [json.loads(line) for line in (REPO / "data" / "quickstart_multiturn" / f"{split}.jsonl").open()]
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps({**row, "agent_cfg_path": str(agent_cfg)}) + "\n" for row in rows))
        files.append(path)
    config = out / f"config_n{samples_per_prompt}.yaml"
    text = CONFIG.read_text()
    for old, new in (
        ("n_samples: 8", f"n_samples: {samples_per_prompt}"),
        ("prompts_per_step: 16", f"prompts_per_step: {GAMES_PER_STEP // samples_per_prompt}"),
    ):
        if old not in text:
            raise SystemExit(f"{CONFIG} no longer holds {old!r}: update this benchmark")
        text = text.replace(old, new)
    config.write_text(text)
    return model, files[0], files[1], config


def run(command: list[str], log: Path | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    with log.open("w") if log else open(os.devnull, "w") as sink:
        subprocess.run(command, check=True, env=env, cwd=log.parent if log else None, stdout=sink, stderr=sink)


def fit(
    out: Path, estimator: str, seed: int, steps: int, data: tuple[Path, Path, Path, Path], extra: list[str]
) -> Path:
    """One ``lit-agentrl fit`` (skipped when its metrics already reach ``steps``); returns its metrics.csv. A folder
    run with another config or other ``extra`` options is refused, so a resumed sweep never mixes settings."""
    model, train, val, config = data
    folder = out / f"{estimator}_s{seed}"
    metrics = folder / "csv" / "version_0" / "metrics.csv"
    settings = folder / "settings.json"
    agent = json.loads(train.read_text().splitlines()[0])["agent_cfg_path"]
    wanted = {"config": config.name, "fit_args": extra, "agent_cfg": Path(agent).read_text()}
    if settings.exists() and json.loads(settings.read_text()) != wanted:
        raise SystemExit(f"{folder} was run with {settings.read_text().strip()}, not {wanted}: pass another --out")
    if metrics.exists() and len(column(metrics, "rollout/reward_mean")) >= steps:
        return metrics
    folder.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps(wanted))
    command = [
        *(sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(config)),
        *("--seed_everything", str(seed), "--trainer.max_steps", str(steps)),
        *("--trainer.logger.init_args.save_dir", str(folder), "--trainer.logger.init_args.version", "0"),
        *("--model.model_path", str(model), "--data.train_files", str(train), "--data.val_files", str(val)),
        *ESTIMATORS[estimator],
        *extra,
    ]
    run(command, folder / "fit.log")
    return metrics


def column(metrics: Path, key: str) -> list[float]:
    with metrics.open() as f:
        return [float(row[key]) for row in csv.DictReader(f) if row.get(key) not in (None, "")]


def fifths(values: list[float]) -> tuple[float, float]:
    n = max(len(values) // 5, 1)
    return statistics.fmean(values[:n]), statistics.fmean(values[-n:])


def mean_abs_advantage(metrics: Path) -> list[float]:
    """Mean over the run of ``train/turn_<t>/advantage_std`` (the spread of the advantages of turn t; logged by the
    turn-level estimators)."""
    return [statistics.fmean(v) for t in (1, 2, 3) if (v := column(metrics, f"train/turn_{t}/advantage_std"))]


def play(metrics: Path) -> tuple[str, str]:
    """From the run's trajectory log: how often the second guess stays inside the range the first answer left
    (``higher``: above the first guess), with what a blind second guess would score after the same first guesses and
    answers in brackets, first fifth -> last fifth of the steps, and the three commonest first guesses of the last
    fifth with their shares."""
    games = []
    for line in (metrics.parent / "trajectories" / "rank0.jsonl").open():
        record = json.loads(line)
        if record["split"] == "train" and not record["failed"]:
            messages = record["messages"]  # prompt, guess, answer, guess, ...
            answer = messages[2]["content"] if len(messages) > 3 else None
            games.append((record["step"], record["extra"]["guesses"], answer))
    if not games:
        return "", ""
    steps = max(step for step, _, _ in games) + 1
    first = [g for g in games if g[0] < steps // 5]
    last = [g for g in games if g[0] >= steps - steps // 5]
    reads = " -> ".join("{:.2f} (blind {:.2f})".format(*reading(part)) for part in (first, last))
    counts = Counter(guesses[0] for _, guesses, _ in last)
    commonest = ", ".join(f"{digit}: {n / len(last):.2f}" for digit, n in counts.most_common(3))
    return reads, commonest


def reading(games: list[tuple[int, list[int | None], str | None]]) -> tuple[float, float]:
    """The share of answered games whose second guess lies inside the range the answer left, and the share a second
    guess uniform over the ten digits would have after the same first guesses and answers: from an edge the answer
    leaves most digits (after 1, ``higher`` leaves 8 of 10), so a first guess that collapses onto an edge raises the
    first share without any reading."""
    inside = answered = 0
    blind = 0.0
    for _, guesses, answer in games:
        first, second = [*guesses, None, None][:2]
        if answer not in ("higher", "lower") or first is None or second is None:
            continue
        answered += 1
        inside += second > first if answer == "higher" else second < first
        blind += (9 - first) / 10 if answer == "higher" else first / 10
    return (inside / answered, blind / answered) if answered else (float("nan"), float("nan"))


def win_rate(first: int | None, read_second: bool, read_third: bool) -> Fraction:
    """The game's exact win rate (a secret uniform over the ten digits, three guesses) for a policy whose first guess
    is ``first`` (None: uniform) and whose second and third guesses are uniform over the range the answers left
    (``read_*``) or over all ten digits (blind)."""
    firsts = range(10) if first is None else [first]
    wins = Fraction(0)
    for secret in range(10):
        for guess in firsts:
            wins += Fraction(1, 10 * len(firsts)) * _win_from(secret, guess, 0, 9, [read_second, read_third])
    return wins


def _win_from(secret: int, guess: int, low: int, high: int, reads: list[bool]) -> Fraction:
    if guess == secret:
        return Fraction(1)
    if not reads:
        return Fraction(0)
    if low <= guess <= high:
        low, high = (max(low, guess + 1), high) if secret > guess else (low, min(high, guess - 1))
    choices = range(low, high + 1) if reads[0] else range(10)
    return sum((_win_from(secret, g, low, high, reads[1:]) for g in choices), Fraction(0)) / len(choices)


READINGS = ((False, False), (False, True), (True, False), (True, True))
"""(second guess reads, third guess reads), the columns of :func:`exact_values`."""


def exact_values() -> None:
    """The win rates behind the report's reading: what reading the answers is worth, and where the first guess
    matters (only once the later guesses read)."""
    print("| first guess | blind after | reads on turn 3 | reads on turn 2 | reads on both |")
    print("|---|---|---|---|---|")
    for first in (None, 1, 4):
        rates = [win_rate(first, second, third) for second, third in READINGS]
        name = "uniform" if first is None else str(first)
        print(f"| {name} | " + " | ".join(f"{float(r):.3f}" for r in rates) + " |")


def report(results: dict[tuple[str, int], Path]) -> None:
    names = " | ".join(s.split("/")[-1] for s in SERIES)
    print(
        f"| estimator | seed | steps | {names} | advantage spread, turns 1/2/3 | partnered turns | reads the answer "
        "| first guesses, last fifth |"
    )
    print("|---|---|---|" + "---|" * (len(SERIES) + 4))
    for (estimator, seed), metrics in sorted(results.items()):
        cells = ["{:.3f} -> {:.3f}".format(*fifths(column(metrics, key))) for key in SERIES]
        spread = " / ".join(f"{v:.2f}" for v in mean_abs_advantage(metrics))
        partnered = column(metrics, "train/partnered_turns")
        paired = "{:.2f} -> {:.2f}".format(*fifths(partnered)) if partnered and estimator.startswith("gigpo") else ""
        steps = len(column(metrics, SERIES[0]))
        reads, commonest = play(metrics)
        print(
            f"| {estimator} | {seed} | {steps} | " + " | ".join(cells) + f" | {spread} | {paired} | {reads} | "
            f"{commonest} |"
        )
    for estimator in ESTIMATORS:
        runs = [m for (e, _), m in results.items() if e == estimator]
        if not runs:
            continue
        cells = []
        for key in SERIES:
            pairs = [fifths(column(m, key)) for m in runs]
            first, last = statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs)
            cells.append(f"{first:.3f} -> {last:.3f} ({last - first:+.3f})")
        print(f"| **{estimator}**, mean of {len(runs)} | | | " + " | ".join(cells) + " | | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for everything the runs write (needed but with --exact)")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    parser.add_argument(
        "--samples-per-prompt", type=int, default=8, help=f"games per prompt (a divisor of {GAMES_PER_STEP})"
    )
    parser.add_argument("--feedback-credit", type=float, default=0.0, help="the shaped reward's weight (0: sparse)")
    parser.add_argument("--turn-credit", action="store_true", help="report the shaped credit per turn")
    parser.add_argument("--fit-args", default="", help="more options for every run's fit, e.g. '--model.loss.gamma 1'")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one thread each)")
    parser.add_argument("--report-only", action="store_true", help="summarise the runs already under --out")
    parser.add_argument("--exact", action="store_true", help="print the game's exact win rates by policy, and stop")
    args = parser.parse_args()
    if args.exact:
        exact_values()
        return
    if args.out is None:
        parser.error("--out is required")
    if args.samples_per_prompt < 1 or GAMES_PER_STEP % args.samples_per_prompt:
        parser.error(f"--samples-per-prompt must divide {GAMES_PER_STEP}, got {args.samples_per_prompt}")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(e, s) for s in args.seeds for e in args.estimators]
    if args.report_only:
        found = {job: args.out / f"{job[0]}_s{job[1]}" / "csv" / "version_0" / "metrics.csv" for job in jobs}
        report({job: path for job, path in found.items() if path.exists()})
        return
    data = prepare(args.out, args.samples_per_prompt, args.feedback_credit, args.turn_credit)
    extra = shlex.split(args.fit_args)
    with ThreadPoolExecutor(args.parallel) as pool:
        paths = pool.map(lambda job: fit(args.out, job[0], job[1], args.steps, data, extra), jobs)
        report(dict(zip(jobs, paths)))


if __name__ == "__main__":
    main()
