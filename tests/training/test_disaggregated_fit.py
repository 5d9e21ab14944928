"""Generation on servers of its own, rehearsed on CPU as GPUs run it (issue 42): two real SGLang servers behind SGLang's
router, two trainer ranks (FSDP2 over gloo), ``async_rollouts: {ahead: 1, partial: true}``, and the weights pushed
over a gloo weight-update group per server, through ``lit-agentrl fit``. Afterwards every server generates as the
trained policy, and a run resumed from a checkpoint taken with rollouts in flight trains those very trajectories."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from support import (
    FSDP_TWO_RANKS,
    REPO_ROOT,
    kill_tree,
    quick_config,
    read_csv,
    require_router,
    require_sglang,
    sglang_server,
    smg_router,
)
from transformers import AutoModelForCausalLM

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPT = [1, 17, 5, 9, 4, 20, 2, 5, 1, 18, 5]


def test_two_ranks_train_one_step_ahead_of_two_servers_behind_the_router(tmp_path, quickstart_model_dir):
    from lit_agentrl.engines.sglang_http import SGLangHTTPEngine

    require_sglang()
    require_router()
    with ExitStack() as stack:
        urls = [stack.enter_context(sglang_server(quickstart_model_dir))[0] for _ in range(2)]
        front = stack.enter_context(smg_router(urls))
        export = {"class_path": "lit_agentrl.callbacks.export.HFExportCallback", "init_args": {"dirpath": "hf"}}
        checkpoint = {  # each gathers both ranks' rollouts in flight
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": "ckpt", "every_n_train_steps": 2, "save_top_k": -1},
        }
        path = quick_config(
            tmp_path,
            quickstart_model_dir,
            steps=4,
            n_samples=8,
            callbacks=[export, checkpoint],
            devices=2,
            strategy=FSDP_TWO_RANKS,
            enable_checkpointing=True,
        )
        config = yaml.safe_load(path.read_text())
        config["trainer"]["callbacks"][0]["init_args"].update(
            engine={
                "name": "sglang_router",
                "kwargs": {"router_url": front, "transport": "collective", "collective_backend": "gloo"},
            },
            async_rollouts={"ahead": 1, "partial": True},
        )
        config["model"].update(loss={"old_logprobs": "trainer"}, correction={"kind": "tis"})
        config["model"]["optimizer"] = {"lr": 0.05}  # every step moves the weights: a missed push shows
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO_ROOT)])}
        command = [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(path)]
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-4000:]

        rows = [r for r in read_csv(next((tmp_path / "logs").rglob("metrics.csv"))) if r.get("rollout/reward_mean")]
        assert len(rows) == 4 and all(float(r["rollout/failed"]) == 0 for r in rows)
        assert all(0.0 <= float(r["rollout/staleness_mean"]) <= 1.0 for r in rows)
        assert all(float(r["sync/bytes"]) > 0 for r in rows[1:])
        assert len(list((tmp_path / "ckpt").iterdir())) == 2
        trained = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "final").eval()
        with torch.no_grad():
            policy = trained.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False, eos_token_id=None)
        for url in urls:  # each server holds the trained weights
            client = SGLangHTTPEngine(url, str(quickstart_model_dir))
            request = client.async_generate(
                input_ids=PROMPT, sampling_params={"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
            )
            assert asyncio.run(request)["output_ids"] == policy[0, len(PROMPT) :].tolist(), url
            client.shutdown()

        # Resumed from step 2's checkpoint: step 3 trains the rollout that was in flight, carried whole (SGLang on
        # CPU does not sample by seed, so a rollout generated again would differ), and step 4 follows.
        step_2 = next(p for p in (tmp_path / "ckpt").iterdir() if "step=2" in p.name)
        resumed = subprocess.run(
            [*command, "--ckpt_path", str(step_2)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
        )
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        again = [
            r for r in read_csv(tmp_path / "logs" / "csv" / "version_1" / "metrics.csv") if r.get("rollout/reward_mean")
        ]
        assert [int(r["step"]) for r in again] == [int(r["step"]) for r in rows[2:]]
        for key in ("rollout/reward_mean", "rollout/response_length_mean", "rollout/staleness_mean"):
            assert again[0][key] == rows[2][key], key  # the very trajectories of the unbroken run's step 3


def test_a_server_killed_mid_run_is_named_and_dropped_and_the_run_goes_on(tmp_path, quickstart_model_dir):
    """One of two servers SIGKILLed while the run trains: the requests it held fail as ``RolloutServerDied`` (counted
    among the step's failures), the next push drops it and removes it from the router, and the run ends on the other."""
    import signal
    import time

    from lit_agentrl.engines.sglang_http import SGLangHTTPEngine

    require_sglang()
    require_router()
    with ExitStack() as stack:
        servers = [stack.enter_context(sglang_server(quickstart_model_dir)) for _ in range(2)]
        urls = [url for url, _ in servers]
        front = stack.enter_context(smg_router(urls))
        export = {"class_path": "lit_agentrl.callbacks.export.HFExportCallback", "init_args": {"dirpath": "hf"}}
        record = {"class_path": "probes.PromptRecorder", "init_args": {"path": str(tmp_path / "prompts.jsonl")}}
        path = quick_config(tmp_path, quickstart_model_dir, steps=8, n_samples=8, callbacks=[export, record])
        config = yaml.safe_load(path.read_text())
        rollout = config["trainer"]["callbacks"][0]["init_args"]
        rollout.update(
            engine={"name": "sglang_router", "kwargs": {"router_url": front}},
            health={"max_failed_fraction": 1.0},  # one of two servers gone: up to half a step's trajectories fail
        )
        rollout["train"]["sampling_params"]["max_new_tokens"] = 48  # rollouts long enough to be caught in flight
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO_ROOT)])}
        command = [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(path)]
        fit = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        prompts = tmp_path / "prompts.jsonl"
        deadline = time.monotonic() + 600
        while (not prompts.exists() or len(prompts.read_text().splitlines()) < 3) and fit.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        doomed_url, doomed = servers[0]
        kill_tree(doomed.pid)
        assert doomed.wait(timeout=60) == -signal.SIGKILL
        _, err = fit.communicate(timeout=900)
        assert fit.returncode == 0, err[-4000:]
        assert f"rollout server {doomed_url} stopped answering" in err  # dropped at the next push
        routed = httpx.get(f"{front}/workers").json()["workers"]  # removed, or draining until the removal ends
        assert [w["url"] for w in routed if w["status"] == "ready"] == [urls[1]]
        rows = [r for r in read_csv(next((tmp_path / "logs").rglob("metrics.csv"))) if r.get("rollout/reward_mean")]
        assert len(rows) == 8
        trained = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "final").eval()
        with torch.no_grad():
            policy = trained.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False, eos_token_id=None)
        client = SGLangHTTPEngine(urls[1], str(quickstart_model_dir))  # the survivor holds the trained weights
        request = client.async_generate(
            input_ids=PROMPT, sampling_params={"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
        )
        assert asyncio.run(request)["output_ids"] == policy[0, len(PROMPT) :].tolist()
        client.shutdown()
