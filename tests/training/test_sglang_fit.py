"""A short fit of the quickstart's shape with the real SGLang engine (run in the SGLang environment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import SGLANG_CPU, free_port, quick_config, read_csv, require_sglang, start_http_server, stop_server

from lit_agentrl.cli import main
from lit_agentrl.engines.sglang_group import wait_until_healthy

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


@pytest.mark.parametrize("lora", [None, {"rank": 8, "sync": "adapter", "base_dtype": "float32"}], ids=["full", "lora"])
def test_fit_with_the_sglang_engine_syncs_weights_each_step(tmp_path, quickstart_model_dir, lora):
    """Every weight pushed, or (``model.lora.sync: adapter``) the adapter alone, loaded into an engine the trainer
    starts to serve it and named by every request."""
    require_sglang()
    agreement = tmp_path / "agreement.jsonl"
    probe = {
        "class_path": "probes.GreedyAgreement",
        "init_args": {"path": str(agreement), "prompt": [1, 17, 5, 9, 4, 20, 2, 5, 1, 18, 5]},
    }
    path = quick_config(tmp_path, quickstart_model_dir, steps=3, callbacks=[probe], n_samples=8)
    config = yaml.safe_load(path.read_text())
    rollout = config["trainer"]["callbacks"][0]["init_args"]
    rollout.update({"engine": {"name": "sglang", "kwargs": dict(SGLANG_CPU)}})
    config["model"]["optimizer"] = {
        "weight_decay": 0.05,
        "lr": 0.05,
    }  # every step moves the weights: a missed sync shows
    if lora is not None:
        config["model"]["lora"] = lora
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path)])

    rows = [r for r in read_csv(next((tmp_path / "logs").rglob("metrics.csv"))) if r.get("rollout/reward_mean")]
    assert len(rows) == 3 and all(float(r["rollout/failed"]) == 0 for r in rows)
    assert all(float(r["rollout/response_length_mean"]) > 0 for r in rows)
    records = [json.loads(line) for line in Path(agreement).read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["engine"] == r["policy"] for r in records), records
    served = [r["adapter"] for r in records]  # one adapter loaded after each step (the engine starts as the policy)
    assert served == ([None] * 3 if lora is None else [f"lit-agentrl-policy-{k}" for k in (1, 2, 3)])


@pytest.mark.parametrize("partial_rollouts", [False, True], ids=["push-between", "partial"])
def test_async_fit_against_an_sglang_server_generates_one_step_ahead(tmp_path, quickstart_model_dir, partial_rollouts):
    """async_rollouts on an SGLang server: rollouts from the manager's background thread, the weight push between them,
    or (partial rollouts) into the server while they generate, which pauses and continues them."""
    require_sglang()
    port = free_port()
    server = start_http_server(quickstart_model_dir, port)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", server)  # the project's start limit: loaded machines are slow
        path = quick_config(tmp_path, quickstart_model_dir, steps=4, n_samples=8)
        config = yaml.safe_load(path.read_text())
        rollout = config["trainer"]["callbacks"][0]["init_args"]
        rollout.update(
            engine={"name": "sglang_http", "kwargs": {"urls": [f"http://127.0.0.1:{port}"]}},
            async_rollouts={"ahead": 1, "partial": partial_rollouts},
        )
        config["model"].update(loss={"old_logprobs": "trainer"}, correction={"kind": "tis"})
        path.write_text(yaml.safe_dump(config))
        main(["fit", "--config", str(path)])
    finally:
        stop_server(server)
    rows = [r for r in read_csv(next((tmp_path / "logs").rglob("metrics.csv"))) if r.get("rollout/reward_mean")]
    staleness = [float(r["rollout/staleness_mean"]) for r in rows]
    if partial_rollouts:  # the push may land before or while the next rollout runs: its tokens are 0 or 1 step old
        assert staleness[0] == 0.0 and all(0.0 <= v <= 1.0 for v in staleness)
        assert all(float(r["rollout/dropped_stale"]) == 0 for r in rows)
    else:
        assert staleness == [0.0, 1.0, 1.0, 1.0]
    assert all(float(r["rollout/failed"]) == 0 and float(r["rollout/response_length_mean"]) > 0 for r in rows)
