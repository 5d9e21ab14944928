"""Whole fits through the CLI on the tiny model: metrics, wandb offline, resume equality, FSDP2 on 2 processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from support import FSDP_TWO_RANKS, REPO_ROOT, quick_config, read_csv, short_fit
from transformers import AutoModelForCausalLM

from lit_agentrl.cli import main

pytestmark = pytest.mark.slow  # whole fits through the CLI

DOCUMENTED_STEP_KEYS = {
    "rollout/reward_mean",
    "rollout/reward_std",
    "rollout/response_length_mean",
    "rollout/num_turns_mean",
    "rollout/failed",
    "train/loss",
    "train/entropy",
    "train/clip_frac",
    "train/grad_norm",
    "time/rollout_s",
    "time/train_s",
    "time/sync_s",
    "time/generation_s",
    "time/forward_s",
    "time/backward_s",
    "time/optimizer_s",
    "time/reward_s",
}


def test_fit_logs_documented_metrics_and_validates(tmp_path, quickstart_model_dir):
    config = quick_config(tmp_path, quickstart_model_dir, steps=4, val_check_interval=2, check_val_every_n_epoch=None)
    main(["fit", "--config", str(config)])
    rows = read_csv(next((tmp_path / "logs").rglob("metrics.csv")))
    step_rows = [r for r in rows if r.get("rollout/reward_mean")]
    assert len(step_rows) == 4
    for row in step_rows:
        assert all(row.get(key) not in (None, "") for key in DOCUMENTED_STEP_KEYS), row
    assert float(step_rows[0]["rollout/failed"]) == 0.0
    for row in step_rows:  # the phases nest inside the step's rollout and update times
        t = {key: float(row[key]) for key in DOCUMENTED_STEP_KEYS if key.startswith("time/")}
        assert 0 < t["time/generation_s"] <= t["time/rollout_s"] and 0 < t["time/reward_s"] <= t["time/rollout_s"]
        assert 0 < t["time/forward_s"] + t["time/backward_s"] + t["time/optimizer_s"] <= t["time/train_s"]
    val = [float(r["val/accuracy"]) for r in rows if r.get("val/accuracy")]
    assert len(val) == 2 and all(0.0 <= v <= 1.0 for v in val)


def test_a_run_without_logger_writes_only_under_outputs(tmp_path, quickstart_model_dir, monkeypatch):
    config = quick_config(tmp_path, quickstart_model_dir, steps=1)
    settings = yaml.safe_load(config.read_text())
    del settings["trainer"]["default_root_dir"], settings["trainer"]["logger"]
    config.write_text(yaml.safe_dump(settings))
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    main(["fit", "--config", str(config), "--trainer.logger", "false", "--trainer.enable_checkpointing", "true"])
    # Lightning's defaults would put config.yaml and checkpoints/ into the current directory.
    assert sorted(p.name for p in workdir.iterdir()) == ["outputs"]
    assert (workdir / "outputs" / "config.yaml").is_file()
    assert list((workdir / "outputs" / "checkpoints").glob("*.ckpt"))


def test_multiturn_quickstart_config_plays_whole_games(tmp_path, quickstart_model_dir, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # the shipped config names its data and agent YAML from the project root
    rows = short_fit("configs/quickstart_multiturn.yaml", quickstart_model_dir, tmp_path)
    steps = [r for r in rows if r.get("rollout/reward_mean")]
    assert len(steps) == 3
    for row in steps:
        assert float(row["rollout/failed"]) == 0.0
        assert 1.0 <= float(row["rollout/response_length_mean"]) <= 3.0  # one token per guess, at most 3 guesses
        assert float(row["rollout/num_turns_mean"]) > 3.0  # most blind games run to a second and third guess
        for turn in (1, 2, 3):
            assert 0.0 <= float(row[f"agent/guess_digit/found_turn_{turn}"]) <= 1.0
    assert [r for r in rows if r.get("val/accuracy")]


def test_wandb_offline_keeps_every_file_in_the_run_folder(tmp_path, quickstart_model_dir, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-files"))
    logger = {
        "class_path": "lightning.pytorch.loggers.WandbLogger",
        "init_args": {"save_dir": str(tmp_path / "wandb-files"), "offline": True, "project": "lit-agentrl-test"},
    }
    config = quick_config(tmp_path, quickstart_model_dir, steps=2, logger=logger)
    main(["fit", "--config", str(config)])
    history = list((tmp_path / "wandb-files").rglob("*.wandb"))
    assert history, "wandb wrote no offline run"
    assert not any(home.iterdir()), f"wandb wrote under HOME: {list(home.rglob('*'))}"


def final_weights(export_dir: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(export_dir).state_dict()


def recorded(path: Path) -> list[tuple]:
    with open(path) as f:
        return [(r["rank"], r["step"], tuple(r["prompts"])) for r in map(json.loads, f)]


@pytest.mark.parametrize("dynamic_sampling", [False, True], ids=["plain", "dynamic-sampling"])
def test_resume_gives_the_weights_and_prompts_of_an_unbroken_run(tmp_path, quickstart_model_dir, dynamic_sampling):
    """With dynamic sampling the extra prompts drawn are part of the data position: the resumed run draws the same."""

    def run(name: str, steps: int, extra: list[dict], args: list[str] = ()) -> Path:
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        callbacks = [
            {"class_path": "probes.PromptRecorder", "init_args": {"path": str(folder / "prompts.jsonl")}},
            {
                "class_path": "lit_agentrl.callbacks.export.HFExportCallback",
                "init_args": {"dirpath": str(folder / "hf")},
            },
            *extra,
        ]
        # Admission by arrival would batch requests by timing, and batch shapes decide the log-probs' bits.
        deterministic = {"deterministic": True}
        config = quick_config(folder, quickstart_model_dir, steps, callbacks, n_samples=8, engine_kwargs=deterministic)
        settings = yaml.safe_load(config.read_text())
        settings["trainer"]["callbacks"][0]["init_args"]["train"]["dynamic_sampling"] = {} if dynamic_sampling else None
        # An entropy bonus gives every step a gradient, whatever its rewards: a tiny random model may earn none in
        # 4 steps, and then the equality below would hold trivially.
        settings["model"]["loss"] = {"entropy_coef": 0.01}
        config.write_text(yaml.safe_dump(settings))
        main(["fit", "--config", str(config), *args])
        return folder

    straight = run("straight", 4, [])
    checkpoint = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(tmp_path / "ckpt"), "every_n_train_steps": 2, "save_top_k": -1},
    }
    first = run("first", 2, [checkpoint], ["--trainer.enable_checkpointing", "true"])
    ckpt = next((tmp_path / "ckpt").glob("*.ckpt"))
    resumed = run("first", 4, [], ["--ckpt_path", str(ckpt)])

    assert recorded(first / "prompts.jsonl") == recorded(straight / "prompts.jsonl")
    a, b = final_weights(straight / "hf" / "final"), final_weights(resumed / "hf" / "final")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    initial = AutoModelForCausalLM.from_pretrained(quickstart_model_dir).state_dict()
    assert not all(torch.equal(a[k], initial[k]) for k in a), "training did not change the weights"
    norms = [
        float(r["train/grad_norm"])
        for r in read_csv(next((straight / "logs").rglob("metrics.csv")))
        if r.get("train/grad_norm")
    ]
    assert any(n > 0 for n in norms), "no step had a policy gradient: the equality would be trivial"
    if dynamic_sampling:  # the untrained model's groups are mostly flat: extra rounds were drawn
        rows = [r for r in read_csv(next((straight / "logs").rglob("metrics.csv"))) if r.get("rollout/dynamic_rounds")]
        assert sum(float(r["rollout/dynamic_rounds"]) for r in rows) > 0


def test_a_resume_from_the_last_checkpoint_writes_the_final_export_the_crashed_run_lacked(
    tmp_path, quickstart_model_dir
):
    """A run killed after its last checkpoint but before its final export, resumed: Lightning skips the training loop
    (and ``on_train_end``) of a fit already at ``max_steps``; the export must still be written."""
    export = {
        "class_path": "lit_agentrl.callbacks.export.HFExportCallback",
        "init_args": {"dirpath": str(tmp_path / "hf")},
    }
    checkpoint = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(tmp_path / "ckpt"), "every_n_train_steps": 2},
    }
    config = quick_config(tmp_path, quickstart_model_dir, 2, [export, checkpoint], enable_checkpointing=True)
    main(["fit", "--config", str(config)])
    trained = final_weights(tmp_path / "hf" / "final")
    shutil.rmtree(tmp_path / "hf" / "final")  # as if killed between the checkpoint and the export
    main(["fit", "--config", str(config), "--ckpt_path", str(next((tmp_path / "ckpt").glob("*step=2.ckpt")))])
    resumed = final_weights(tmp_path / "hf" / "final")
    assert all(torch.equal(trained[k], resumed[k]) for k in trained)


@pytest.mark.timeout(600)
def test_two_process_fsdp2_fit_syncs_exact_weights_checkpoints_and_exports(tmp_path, quickstart_model_dir):
    callbacks = [
        {"class_path": "probes.SyncChecker", "init_args": {"path": str(tmp_path / "sync.jsonl")}},
        {"class_path": "probes.PromptRecorder", "init_args": {"path": str(tmp_path / "prompts.jsonl")}},
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(tmp_path / "ckpt"), "every_n_train_steps": 2, "save_top_k": -1},
        },
        {"class_path": "lit_agentrl.callbacks.export.HFExportCallback", "init_args": {"dirpath": str(tmp_path / "hf")}},
    ]
    config = quick_config(
        tmp_path,
        quickstart_model_dir,
        steps=3,
        callbacks=callbacks,
        devices=2,
        strategy=FSDP_TWO_RANKS,
        enable_checkpointing=True,
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO_ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stderr[-4000:]

    syncs = [json.loads(line) for line in Path(tmp_path / "sync.jsonl").read_text().splitlines()]
    assert sorted((s["rank"], s["step"]) for s in syncs) == [(r, s) for r in (0, 1) for s in (1, 2, 3)]
    assert all(s["sharded"] and s["mismatched"] == [] for s in syncs), syncs
    prompts = recorded(tmp_path / "prompts.jsonl")
    for step in (0, 1, 2):
        per_rank = [p for r, s, p in prompts if s == step]
        assert len(per_rank) == 2 and all(len(p) == 2 for p in per_rank)
    assert (tmp_path / "ckpt").exists() and any((tmp_path / "ckpt").iterdir())
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "final")
    assert exported.config.vocab_size == AutoModelForCausalLM.from_pretrained(quickstart_model_dir).config.vocab_size


def test_validate_subcommand_reports_accuracy(tmp_path, quickstart_model_dir, capsys):
    config = quick_config(tmp_path, quickstart_model_dir, steps=1)
    main(["validate", "--config", str(config)])
    rows = read_csv(next((tmp_path / "logs").rglob("metrics.csv")))
    assert any(r.get("val/accuracy") for r in rows)
