"""Rows 3 and 4 of scripts/gpu_checks.py: a short real ``lit-agentrl fit`` and the ``memory/*`` metrics it logged,
then the memory planner's predictions for the same settings beside what rows 1 and 3 measured."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_profiles import GB, MEMORY_KEYS, REPO_ROOT, SMOKE_CONFIG, Profile, Row, Skip, device_of

# ---------------------------------------------------------------------------------------------------- row 3


def fit_config(profile: Profile, model_dir: Path, workdir: Path) -> dict[str, Any]:
    """configs/qwen3_0_6b_gpu_smoke.yaml (FSDP2 over one process: its ModelParallelStrategy) with the local model,
    logs in ``workdir`` and validation off."""
    import yaml

    from lit_agentrl.config.run_file import set_keys

    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    trainer = config["trainer"]
    for key in ("val_check_interval", "check_val_every_n_epoch"):
        trainer.pop(key, None)
    trainer.update(
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(workdir),
    )
    trainer["logger"]["init_args"] = {"save_dir": str(workdir / "logs"), "name": "csv"}
    config["model"]["model_path"] = str(model_dir)
    for key in ("train_files", "val_files"):  # the fit runs in ``workdir``
        config["data"][key] = str(REPO_ROOT / config["data"][key])
    return set_keys(config, profile.fit_overrides)


def measure_fit(profile: Profile, model_dir: Path, workdir: Path, sglang: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A real ``lit-agentrl fit`` in a child process; its CSV's ``memory/*`` metrics, "missing" where not logged."""
    from lit_agentrl.config.run_file import rollout_args, write_config

    config = fit_config(profile, model_dir, workdir)
    if rollout_args(config)["engine"]["name"] == "sglang" and not sglang["importable"]:
        raise Skip(sglang["error"])
    if config["trainer"]["accelerator"] in ("gpu", "cuda"):
        device_of(profile)  # Skip without a GPU
    workdir.mkdir(parents=True, exist_ok=True)
    path = write_config(config, workdir / "config.yaml")
    seconds = run_fit(path, workdir, profile.fit_timeout_s, profile.cpu_threads)
    return fit_result(config, workdir, seconds)


def run_fit(config: Path, workdir: Path, timeout_s: int, threads: int | None) -> float:
    """``python -m lit_agentrl.cli fit`` in its own session (SGLang's children die with it on a timeout)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(workdir / "wandb"),
        "TOKENIZERS_PARALLELISM": "false",
        **({"OMP_NUM_THREADS": str(threads)} if threads else {}),
    }
    log = workdir / "fit.log"
    start = time.perf_counter()
    with open(log, "w") as out:
        command = [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(config)]
        proc = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_group(proc)  # whatever the fit left running (SGLang's processes) goes, so rows 1-2 get the GPU
    if code is None:
        raise RuntimeError(f"the fit ran over {timeout_s} s (log: {log})")
    if code != 0:
        tail = log.read_text()[-3000:]
        print(tail, file=sys.stderr)
        last = next((line for line in reversed(tail.splitlines()) if line.strip()), "?")
        raise RuntimeError(f"the fit exited {code}: {last.strip()} (log: {log})")
    return time.perf_counter() - start


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # nothing left
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def fit_result(config: dict[str, Any], workdir: Path, seconds: float) -> tuple[dict[str, Any], str]:
    """The fit's steps, seconds and each ``memory/*`` metric's largest logged value, from its CSV logger."""
    from lit_agentrl.config.run_file import rollout_args

    found = sorted((workdir / "logs").rglob("metrics.csv"))
    if not found:
        raise RuntimeError(f"the fit wrote no metrics.csv under {workdir / 'logs'}")
    with open(found[-1]) as f:
        rows = list(csv.DictReader(f))
    steps = sum(1 for r in rows if r.get("rollout/reward_mean"))
    memory = {key: _max_logged(rows, key) for key in MEMORY_KEYS}
    engine = rollout_args(config)["engine"]
    metrics = {
        "engine": engine["name"],
        "colocate": engine.get("colocate", False),
        "steps": steps,
        "seconds": round(seconds, 1),
        "memory_gb": memory,  # each key's largest value over the logged steps; None: not logged
        "metrics_csv": str(found[-1]),
    }
    shown = "; ".join(f"{k.removeprefix('memory/')} {v if v is not None else 'missing'}" for k, v in memory.items())
    summary = (
        f"{engine['name']}, colocate {str(metrics['colocate']).lower()}: {steps} steps in {seconds:.0f} s; {shown}"
    )
    return metrics, summary


def _max_logged(rows: list[dict[str, str]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return round(max(values), 2) if values else None


# ---------------------------------------------------------------------------------------------------- row 4


def training_plan_inputs(profile: Profile, model_dir: Path, gpu_memory: int) -> Any:
    """Row 1's settings as the planner's inputs; the transformers engine adds no modelled GPU memory."""
    from lit_agentrl.callbacks import RolloutCallback
    from lit_agentrl.config.training import Compute
    from lit_agentrl.plan import TrainerLayout, inputs_from_run
    from lit_agentrl.training.module import GRPOModule

    compute = Compute(
        micro_batch_tokens=profile.micro_batch_tokens,
        param_dtype=profile.param_dtype,
        gradient_checkpointing=False,
        sequence_packing=True,
    )
    module = GRPOModule(str(model_dir), compute=compute)
    return inputs_from_run(module, RolloutCallback(engine="transformers"), None, TrainerLayout(), gpu_memory)


def measure_plan(
    profile: Profile, model_dir: Path, workdir: Path, train: Row, fit: Row, gpu_memory: int | None
) -> tuple[dict[str, Any], str]:
    """The planner's training and generating peaks beside rows 1 and 3's measurements, with relative errors."""
    from lit_agentrl.cli import inputs_from_config
    from lit_agentrl.plan import plan_memory

    memory = gpu_memory or 80 * GB  # on CPU the planner's default GPU; the peaks do not depend on it
    trained = plan_memory(training_plan_inputs(profile, model_dir, memory)).phases
    fitted = plan_memory(inputs_from_config(fit_config(profile, model_dir, workdir), memory)).phases
    fit_memory = fit.metrics.get("memory_gb") or {}
    rows = [
        _compare("training peak vs row 1 max_memory_allocated", trained["training"], train.metrics.get("peak_allocated_gb")),
        _compare("fit training peak vs trainer_peak_gb_train", fitted["training"], fit_memory.get("memory/trainer_peak_gb_train")),
        _compare("fit training peak vs gpu_used_gb_train", fitted["training"], fit_memory.get("memory/gpu_used_gb_train")),
        _compare("fit generating peak vs gpu_used_gb_rollout", fitted["generation"], fit_memory.get("memory/gpu_used_gb_rollout")),
    ]  # fmt: skip
    metrics = {"gpu_memory_gb": round(memory / GB, 1), "comparisons": rows}
    return metrics, "; ".join(_describe(c) for c in rows)


def _compare(what: str, predicted: int, measured: float | None) -> dict[str, Any]:
    predicted_gb = round(predicted / GB, 2)
    error = round((predicted_gb - measured) / measured, 3) if measured else None
    return {"what": what, "predicted_gb": predicted_gb, "measured_gb": measured, "rel_error": error}


def _describe(c: dict[str, Any]) -> str:
    if c["measured_gb"] is None:
        return f"{c['what']}: plan {c['predicted_gb']} GB vs n/a"
    error = f" ({c['rel_error']:+.0%})" if c["rel_error"] is not None else ""
    return f"{c['what']}: plan {c['predicted_gb']} GB vs {c['measured_gb']} GB{error}"
