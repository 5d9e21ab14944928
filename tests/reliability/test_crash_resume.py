"""SIGKILL in the middle of a run, resume from the last checkpoint: nothing lost, nothing repeated."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.io import torch_io
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from support import REPO_ROOT, quick_config
from transformers import AutoModelForCausalLM

from lit_agentrl.training.checkpoint import AtomicCheckpointIO

STEPS = 6
TRAINING = REPO_ROOT / "tests" / "training"


def config_for(folder: Path, model_dir: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    callbacks = [
        {"class_path": "probes.PromptRecorder", "init_args": {"path": str(folder / "prompts.jsonl")}},
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(folder / "ckpt"), "every_n_train_steps": 1, "save_top_k": -1},
        },
        {"class_path": "lit_agentrl.callbacks.export.HFExportCallback", "init_args": {"dirpath": str(folder / "hf")}},
    ]
    # Deterministic admission: the engine's batches, hence its log-probs and samples, do not depend on timing
    # (engines.admission); without it a loaded machine breaks bit-exactness now and then.
    return quick_config(
        folder,
        model_dir,
        STEPS,
        callbacks,
        n_samples=8,
        engine_kwargs={"deterministic": True},
        enable_checkpointing=True,
    )


def launch(config: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRAINING), str(REPO_ROOT)])}
    return subprocess.Popen(
        [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(config), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def steps_recorded(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def final_prompts(path: Path) -> dict[int, list[str]]:
    """Step -> prompts of the step that was finally trained (a step redone after the crash overwrites)."""
    trained: dict[int, list[str]] = {}
    for record in map(json.loads, path.read_text().splitlines()):
        trained[record["step"]] = record["prompts"]
    return trained


@pytest.mark.timeout(1500)  # three runs of 6 steps; generous for the loaded-machine check (benchmarks/README.md)
@pytest.mark.slow
def test_sigkill_then_resume_matches_an_unbroken_run(tmp_path, quickstart_model_dir):
    straight = config_for(tmp_path / "straight", quickstart_model_dir)
    assert launch(straight).wait(timeout=480) == 0

    crashed = config_for(tmp_path / "crashed", quickstart_model_dir)
    kill_after = random.Random().randint(2, STEPS - 2)  # a random step, as a crash would pick
    process = launch(crashed)
    deadline = time.monotonic() + 480
    while steps_recorded(tmp_path / "crashed" / "prompts.jsonl") < kill_after + 1 and process.poll() is None:
        assert time.monotonic() < deadline, "the run never reached the step to kill it at"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL

    checkpoints = sorted(
        (tmp_path / "crashed" / "ckpt").glob("*.ckpt"), key=lambda p: int(re.search(r"step=(\d+)", p.name)[1])
    )
    assert checkpoints, "no checkpoint was written before the kill"
    resumed = launch(crashed, "--ckpt_path", str(checkpoints[-1]))
    _, err = resumed.communicate(timeout=480)
    assert resumed.returncode == 0, err[-3000:]

    assert final_prompts(tmp_path / "crashed" / "prompts.jsonl") == final_prompts(
        tmp_path / "straight" / "prompts.jsonl"
    )
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "straight" / "hf" / "final").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "crashed" / "hf" / "final").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), f"killed after step {kill_after}: weights differ"


@pytest.mark.parametrize("io_class, survives", [(AtomicCheckpointIO, True), (TorchCheckpointIO, False)])
def test_interrupted_save_leaves_the_previous_checkpoint_usable(tmp_path, monkeypatch, io_class, survives):
    """A write that dies half-way (a full disk, a kill) destroys Lightning's file in place, not ours."""
    io = io_class()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "weights": torch.ones(4)}, path)

    def dies_mid_write(checkpoint, target):
        with open(target, "wb") as f:
            f.write(b"partial checkpoint bytes")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch_io, "_atomic_save", dies_mid_write)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"step": 2, "weights": torch.zeros(4)}, path)
    monkeypatch.undo()
    if survives:
        assert io.load_checkpoint(path)["step"] == 1
        assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    else:
        with pytest.raises(Exception):  # noqa: B017  # whatever torch raises for a truncated file
            io.load_checkpoint(path)
