"""The GRPO update's options, end to end on the tiny model: non-finite skips, KL, mini-batches, aggregation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import quick_config, read_csv

from lit_agentrl.cli import main

pytestmark = pytest.mark.slow  # whole fits through the CLI


def fit(tmp_path, model_dir, steps: int, callbacks: list[dict] | None = None, **model) -> list[dict]:
    path = quick_config(tmp_path, model_dir, steps, callbacks)
    config = yaml.safe_load(path.read_text())
    config["model"].update(model)
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path)])
    return [r for r in read_csv(next((tmp_path / "logs").rglob("metrics.csv"))) if r.get("train/loss")]


@pytest.mark.timeout(300)
def test_non_finite_gradient_skips_the_update_and_is_counted(tmp_path, quickstart_model_dir):
    watch = tmp_path / "weights.jsonl"
    callbacks = [
        {"class_path": "probes.PoisonReward", "init_args": {"batches": [1]}},
        {"class_path": "probes.WeightWatcher", "init_args": {"path": str(watch)}},
    ]
    # Weight decay makes every applied step move the weights, whatever the rewards were.
    rows = fit(
        tmp_path, quickstart_model_dir, steps=3, callbacks=callbacks, optimizer={"lr": 5e-4, "weight_decay": 0.01}
    )
    records = [json.loads(line) for line in Path(watch).read_text().splitlines()]
    # Batch 1 is poisoned: its step is skipped (weights unchanged), so 3 optimizer steps take 4 batches.
    assert [r["changed"] for r in records] == [True, False, True, True]
    assert all(r["finite"] for r in records)
    assert [float(r["train/skipped_steps"]) for r in rows] == [0.0, 1.0, 1.0, 1.0]


def test_kl_entropy_bonus_mini_batches_and_sequence_aggregation(tmp_path, quickstart_model_dir):
    rows = fit(
        tmp_path,
        quickstart_model_dir,
        steps=4,
        optimizer={"lr": 5e-4, "mini_batches": 2, "warmup_steps": 2, "lr_schedule": "cosine"},
        loss={"kl_coef": 0.1, "entropy_coef": 0.01, "aggregation": "seq-mean-token-mean", "advantage_std": "none"},
        compute={"micro_batch_tokens": 16},
    )
    assert len(rows) == 2  # two rollout batches, two optimizer steps each
    assert all(float(r["train/kl"]) >= 0.0 for r in rows)
    # Warm-up over 2 steps then cosine to 10%: after optimizer steps 2 and 4 the factors are 1.0 and 0.1.
    assert [float(r["train/lr"]) for r in rows] == pytest.approx([5e-4, 5e-5])
