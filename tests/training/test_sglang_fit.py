"""A short fit of the quickstart's shape with the real SGLang engine (run in the SGLang environment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import SGLANG_CPU, quick_config, read_csv, require_sglang

from lit_agentrl.cli import main

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def test_fit_with_the_sglang_engine_syncs_weights_each_step(tmp_path, quickstart_model_dir):
    require_sglang()
    agreement = tmp_path / "agreement.jsonl"
    probe = {
        "class_path": "probes.GreedyAgreement",
        "init_args": {"path": str(agreement), "prompt": [1, 17, 5, 9, 4, 20, 2, 5, 1, 18, 5]},
    }
    path = quick_config(tmp_path, quickstart_model_dir, steps=3, callbacks=[probe], n_samples=8)
    config = yaml.safe_load(path.read_text())
    rollout = config["trainer"]["callbacks"][0]["init_args"]
    rollout.update({"engine": "sglang", "engine_kwargs": dict(SGLANG_CPU)})
    config["model"]["weight_decay"] = 0.05  # every step moves the weights, so a missed sync would show
    config["model"]["lr"] = 0.05
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path)])

    rows = [r for r in read_csv(next((tmp_path / "logs").rglob("metrics.csv"))) if r.get("rollout/reward_mean")]
    assert len(rows) == 3 and all(float(r["rollout/failed"]) == 0 for r in rows)
    assert all(float(r["rollout/response_length_mean"]) > 0 for r in rows)
    records = [json.loads(line) for line in Path(agreement).read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["engine"] == r["policy"] for r in records), records
