"""scripts/gpu_checks.py: the GPU proof's code paths, run on CPU with a tiny model (``--smoke``), print one table."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_checks.py"
MEMORY_NAMES = [
    "gpu_used_gb_rollout",
    "gpu_used_gb_train",
    "gpu_used_gb_sync",
    "trainer_peak_gb_rollout",
    "trainer_peak_gb_train",
    "trainer_peak_gb_sync",
    "offloaded_gb",
]
ROOT_SUSPECTS = ("lightning_logs", "wandb", "gpu_checks.json", "table.json", "config.yaml", "model")


def load_script():
    """The script as a module, loaded by path: it puts scripts/ on sys.path itself for its gpu_* siblings."""
    spec = importlib.util.spec_from_file_location("gpu_checks", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a subprocess that itself launches a fit: about a minute on 2 cores
def test_smoke_run_fills_every_row_and_writes_the_table_outside_the_repo(tmp_path: Path):
    out = tmp_path / "table.json"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb")}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not [name for name in ROOT_SUSPECTS if (REPO_ROOT / name).exists()]
    table = json.loads(out.read_text())
    rows = {row["id"]: row for row in table["rows"]}
    assert sorted(rows) == [1, 2, 3, 4]
    assert all(r["status"] == "ok" for r in rows.values()), rows  # on CPU nothing is SGLang- or GPU-only

    train = rows[1]["metrics"]
    assert train["param_dtype"] == "bfloat16" and train["sequence_packing"] is True  # GRPOModule's checks passed
    assert train["tokens_per_step"] == 8 * 64 and train["tokens_per_s"] > 0 and train["step_s"] > 0
    assert train["params"] > 0 and train["mfu"] is None and train["peak_allocated_gb"] is None  # CPU: no peak
    generate = rows[2]["metrics"]
    assert generate["generated_tokens"] == 4 * 8 and generate["tokens_per_s"] > 0
    fit = rows[3]["metrics"]
    assert fit["engine"] == "transformers" and fit["colocate"] is False and fit["steps"] == 2
    assert set(fit["memory_gb"]) == {f"memory/{k}" for k in MEMORY_NAMES}
    comparisons = rows[4]["metrics"]["comparisons"]
    assert len(comparisons) == 4 and all(c["predicted_gb"] > 0 for c in comparisons)
    assert all(c["measured_gb"] is None or c["rel_error"] is not None for c in comparisons)

    assert result.stdout.count("| # | check | status | measured |") == 1  # one table
    assert "MFU = 6 x params x tokens" in result.stdout and table["machine"]["torch"]


@pytest.mark.slow  # a process group in this process and a model built on disk
def test_fp32_training_row_runs_packed_too(tmp_path: Path):
    checks = load_script()  # the smoke profile's row 1 is bf16 (the smoke run covers it); fp32 has the tighter check
    profile = dataclasses.replace(checks.SMOKE, param_dtype="float32")
    model_dir = checks.build_model_dir(profile, tmp_path / "model")
    row = checks.run_row(1, "fp32", lambda: checks.measure_training(profile, model_dir, None))
    assert row.status == "ok", row.detail
    assert row.metrics["tokens_per_s"] > 0 and row.metrics["param_dtype"] == "float32"
    assert row.metrics["sequence_packing"] is True


def test_cuda_rows_skip_without_a_gpu_and_the_fit_without_sglang(tmp_path: Path, monkeypatch):
    checks = load_script()
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    row = checks.run_row(2, "engine", lambda: checks.measure_generation(checks.GPU, tmp_path))
    assert (row.status, row.detail) == ("skipped", "no CUDA GPU visible")
    no_sglang = {"importable": False, "version": None, "error": "sglang not installed"}
    row = checks.run_row(3, "fit", lambda: checks.measure_fit(checks.GPU, tmp_path, tmp_path / "fit", no_sglang))
    assert (row.status, row.detail) == ("skipped", "sglang not installed")
    assert "| 3 | fit | skipped: sglang not installed |" in checks.markdown([row], [])


def test_info_lists_every_installed_distribution_for_the_machines_list():
    """On the GPU machine, ``--info`` prints what belongs in scripts/gpu_machine.txt (the wheelhouse leaves it out)."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--info"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = done.stdout.split("# installed distributions")[1].splitlines()[1:]
    import torch

    assert f"torch=={torch.__version__}" in listed and any(line.startswith("lightning==") for line in listed)
