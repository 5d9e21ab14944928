"""The GPU proof (issue 11, item 9): one table of what the training and rollout paths do on this machine.

Rows (each ok / skipped: reason / failed: error, so one failing part hides none of the others):

1. FSDP2 training step: ``GRPOModule.accumulate_gradients`` plus AdamW on synthetic samples, one process, a
   DeviceMesh of size 1 (NCCL on GPU, gloo on CPU), the policy sharded by the module's own ``configure_model``.
   Tokens/s, MFU, peak memory.
2. The transformers engine (``lit_agentrl/engines/hf.py``): generation tokens/s over a batch of prompts.
3. A short real ``lit-agentrl fit`` (colocated SGLang on GPU) and the ``memory/*`` metrics it logged.
4. The memory planner (``lit_agentrl.plan``) for the same settings, beside what rows 1 and 3 measured.

The model is random-init with Qwen3-0.6B's shapes, built from a config into a temp folder (no download).
The parts live beside this file: gpu_profiles.py (the profiles, the model, the row type), gpu_machine_info.py,
gpu_throughput.py (rows 1 and 2) and gpu_fit_plan.py (rows 3 and 4).

    python scripts/gpu_checks.py [--out table.json]   # on a CUDA GPU
    python scripts/gpu_checks.py --smoke              # the same code paths on CPU with a tiny model
    python scripts/gpu_checks.py --info               # what the machine has, then exit

Exits 1 when a row failed (skips are fine). Everything it writes goes to temp folders, or to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
# The sibling gpu_* modules: `python scripts/gpu_checks.py` puts scripts/ on sys.path, a test's
# spec_from_file_location does not. The repo root goes first: this checkout's lit_agentrl, installed or not.
sys.path[:0] = [str(SCRIPTS.parent), str(SCRIPTS)]

from gpu_fit_plan import measure_fit, measure_plan  # noqa: E402
from gpu_machine_info import (  # noqa: E402
    gpu_memory_bytes,
    installed_distributions,
    machine_info,
    peak_flops_for,
    sglang_status,
)
from gpu_profiles import GPU, MFU_FORMULA, SMOKE, SMOKE_CONFIG, Profile, Row, build_model_dir, run_row  # noqa: E402
from gpu_throughput import measure_generation, measure_training  # noqa: E402


def markdown(rows: list[Row], notes: list[str]) -> str:
    """The table, one line per row (``|`` escaped), then the notes."""

    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| # | check | status | measured |", "|---|---|---|---|"]
    lines += [f"| {r.id} | {esc(r.check)} | {esc(r.cell())} | {esc(r.summary)} |" for r in rows]
    return "\n".join([*lines, "", *notes])


def notes_for(profile: Profile, peak_flops: float | None) -> list[str]:
    """What the table's numbers mean: the model, the MFU formula and peak, how row 1 times, row 3's settings."""
    peak = f"{peak_flops / 1e12:.0f} TFLOP/s" if peak_flops else "unknown here (pass --peak-tflops)"
    return [
        f"profile: {profile.name}; row 1 model and fit model: random-init Qwen3 {profile.model}",
        f"{MFU_FORMULA}; peak used: {peak} (H200 dense bf16: 989 TFLOP/s)",
        "row 1 times accumulate_gradients + clip + AdamW over the timed steps, after one warm-up step",
        f"row 3: {SMOKE_CONFIG.name} (ModelParallelStrategy, data_parallel_size=1), no validation, {profile.fit_overrides}",
        "GB = 10^9 bytes; row 3 shows each memory/* metric's largest value over the steps ('missing': not logged)",
    ]


def run_checks(profile: Profile, workdir: Path, peak_tflops: float | None) -> dict[str, Any]:
    """Every row. The fit runs first, before this process creates a CUDA context that its device-wide memory
    figures would include; the table lists the rows in order."""
    start = time.perf_counter()
    sglang = sglang_status()
    model_dir = build_model_dir(profile, workdir / "model")
    fit_dir = workdir / "fit"
    fit = run_row(3, "lit-agentrl fit: memory over the rollout/train/sync cycle", lambda: measure_fit(profile, model_dir, fit_dir, sglang))  # fmt: skip
    info = machine_info(sglang)
    peak_flops = peak_flops_for(profile, peak_tflops)
    train = run_row(1, "FSDP2 training step (GRPOModule.accumulate_gradients)", lambda: measure_training(profile, model_dir, peak_flops))  # fmt: skip
    generate = run_row(2, "transformers engine generation", lambda: measure_generation(profile, model_dir))
    plan = run_row(4, "planner (lit_agentrl.plan) vs measured", lambda: measure_plan(profile, model_dir, fit_dir, train, fit, gpu_memory_bytes()))  # fmt: skip
    rows = [train, generate, fit, plan]
    notes = notes_for(profile, peak_flops)
    return {
        "profile": profile.name,
        "machine": info,
        "rows": [dataclasses.asdict(r) for r in rows],
        "notes": notes,
        "markdown": markdown(rows, notes),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model: the same code paths, in about a minute")
    parser.add_argument("--out", type=Path, help="the table as JSON (default: a new temp folder)")
    parser.add_argument("--workdir", type=Path, help="model, fit config and logs (default: temp, kept on failure)")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for MFU")
    parser.add_argument("--info", action="store_true", help="print what the machine has and exit")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.info:
        for key, value in machine_info(sglang_status()).items():
            print(f"{key}: {value}")
        print("\n# installed distributions, for scripts/gpu_machine.txt (what scripts/gpu_wheelhouse.py leaves out):")
        print("\n".join(installed_distributions()))
        return 0
    profile = SMOKE if args.smoke else GPU
    if profile.cpu_threads:
        import torch

        torch.set_num_threads(profile.cpu_threads)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu_checks_"))
    result = run_checks(profile, workdir, args.peak_tflops)
    failed = any(r["status"] == "failed" for r in result["rows"])
    if args.workdir is None and not failed:
        shutil.rmtree(workdir, ignore_errors=True)
    elif failed:
        print(f"kept for the logs (fit.log, config.yaml): {workdir}")
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_checks_")) / "gpu_checks.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print("\n" + "\n".join(f"{k}: {v}" for k, v in result["machine"].items()))
    print("\n" + result["markdown"])
    print(f"\ntable JSON: {out} ({result['wall_s']} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
