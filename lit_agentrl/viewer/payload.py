"""A run's trajectory logs and metrics read back into the one JSON payload the viewer page embeds."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lit_agentrl.display import inert_values
from lit_agentrl.viewer.records import RECORD_KEY

CURVES = {
    "reward": ["rollout/reward_mean", "val/reward_mean"],
    "length": ["rollout/response_length_mean"],
    "accuracy": ["val/accuracy"],
    "turns": ["rollout/num_turns_mean"],
}
"""The page's charts: title -> the metrics.csv columns drawn in it."""


def build_payload(run_dir: str | Path, max_trajectories: int | None = None) -> dict[str, Any]:
    """The newest trajectory log under ``run_dir`` (every rank's file), the metrics beside it, and a summary.

    ``max_trajectories`` keeps the latest ones (by step). Raises ``FileNotFoundError`` when there is no log.
    """
    log_dir = find_log_dir(Path(run_dir))
    records, bad_lines = read_records(sorted(log_dir.glob("*.jsonl")))
    records.sort(key=_order)
    dropped = 0
    if max_trajectories is not None and len(records) > max_trajectories:
        dropped = len(records) - max_trajectories
        records = records[dropped:]
    metrics_path = find_metrics(log_dir.parent)
    curves = read_curves(metrics_path) if metrics_path else curves_from_records(records)
    return {
        "run": str(log_dir.parent),
        "metrics_file": str(metrics_path) if metrics_path else None,
        "trajectories": inert_values(records),  # shown as text: escapes instead of controls and bidi overrides
        "dropped": dropped,
        "bad_lines": bad_lines,
        "curves": curves,
    }


def find_log_dir(run_dir: Path) -> Path:
    """``run_dir/trajectories``, else the most recently written ``trajectories/`` folder below it."""
    if (run_dir / "trajectories").is_dir() and any((run_dir / "trajectories").glob("*.jsonl")):
        return run_dir / "trajectories"
    logs = [p for p in run_dir.rglob("trajectories/*.jsonl") if p.is_file()]
    if not logs:
        raise FileNotFoundError(
            f"{run_dir}: no trajectories/*.jsonl below it; add lit_agentrl.callbacks.TrajectoryLog to "
            "trainer.callbacks to write them"
        )
    return max(logs, key=lambda p: p.stat().st_mtime).parent


def read_records(paths: Iterable[Path]) -> tuple[list[dict[str, Any]], int]:
    """Every record of the files, the last line of each trajectory winning (a resumed run may log a step again),
    and the number of lines that did not parse (a run killed mid-write leaves a partial last line)."""
    by_key: dict[tuple, dict[str, Any]] = {}
    bad = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if isinstance(record, dict):
                    by_key[tuple(record.get(k) for k in RECORD_KEY)] = record
                else:
                    bad += 1
    return list(by_key.values()), bad


def _order(record: dict[str, Any]) -> tuple:
    return tuple((0, "") if record.get(k) is None else (1, record[k]) for k in ("step", *RECORD_KEY))


def find_metrics(folder: Path) -> Path | None:
    """``metrics.csv`` in the log's run folder, else the newest one below it."""
    if (folder / "metrics.csv").is_file():
        return folder / "metrics.csv"
    found = [p for p in folder.rglob("metrics.csv") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def read_curves(path: Path) -> dict[str, dict[str, list[list[float]]]]:
    """``{chart: {metric: [[step, value], ...]}}`` from a CSVLogger's metrics.csv (empty cells skipped)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    curves: dict[str, dict[str, list[list[float]]]] = {}
    for chart, keys in CURVES.items():
        series = {key: _points((row.get("step"), row.get(key)) for row in rows) for key in keys}
        series = {key: points for key, points in series.items() if points}
        if series:
            curves[chart] = series
    return curves


def _points(pairs: Iterable[tuple[str | None, str | None]]) -> list[list[float]]:
    points = []
    for step, value in pairs:
        try:
            x, y = float(step or ""), float(value or "")
        except ValueError:
            continue
        if math.isfinite(x) and math.isfinite(y):
            points.append([x, y])
    return points


def curves_from_records(records: list[dict[str, Any]]) -> dict[str, dict[str, list[list[float]]]]:
    """Without metrics.csv (a wandb run): the logged samples' own means per training step."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("split") == "train" and not r.get("failed"):
            by_step.setdefault(int(r["step"]), []).append(r)
    steps = sorted(by_step)

    def mean(key: str) -> list[list[float]]:
        return [[s, sum(float(r.get(key) or 0) for r in by_step[s]) / len(by_step[s])] for s in steps]

    if not steps:
        return {}
    return {
        "reward": {"logged samples: reward mean": mean("reward")},
        "length": {"logged samples: generated tokens mean": mean("generated_tokens")},
    }
