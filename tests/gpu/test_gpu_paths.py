"""GPU-only paths: colocated SGLang memory release/resume, NCCL FSDP2 training. Skipped without CUDA.

Run them all on a GPU machine with ``scripts/gpu_checks.sh``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from support import REPO_ROOT, require_sglang

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def free_gib() -> float:
    free, _ = torch.cuda.mem_get_info()
    return free / 2**30


@pytest.mark.sglang
def test_colocated_release_frees_memory_and_resume_restores_generation(tiny_model_dir, policy_model):
    """The colocated window's cycle: release, resume, push, generate. SGLang 0.5.23 drops released weights unless
    started with ``enable_weights_cpu_backup`` (which colocated runs do not set), so the push is what restores them."""
    require_sglang()
    from lit_agentrl.engines.sglang import SGLangEngine

    engine = SGLangEngine(str(tiny_model_dir), dtype="bfloat16", mem_fraction_static=0.3, enable_memory_saver=True)
    params = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
    try:
        before = engine.loop.run_until_complete(engine.async_generate(input_ids=[5, 6, 7], sampling_params=params))
        held = free_gib()
        engine.release_memory_occupation(tags=["kv_cache", "weights"])
        released = free_gib()
        engine.resume_memory_occupation(tags=["weights"])
        weights = [(name, t.to("cuda", torch.bfloat16)) for name, t in policy_model.named_parameters()]
        assert engine.update_weights_from_tensor(weights)[0]
        engine.resume_memory_occupation(tags=["kv_cache"])
        resumed = free_gib()
        after = engine.loop.run_until_complete(engine.async_generate(input_ids=[5, 6, 7], sampling_params=params))
    finally:
        engine.shutdown()
    print(json.dumps({"free_gib_held": held, "free_gib_released": released, "free_gib_resumed": resumed}))
    assert released - held > 0.1 * torch.cuda.get_device_properties(0).total_memory / 2**30 * 0.3
    assert resumed < released
    assert after["output_ids"] == before["output_ids"]


def test_fsdp2_fit_over_nccl_syncs_exact_weights(tmp_path, quickstart_model_dir):
    if torch.cuda.device_count() < 1:
        pytest.skip("needs a GPU")
    devices = min(2, torch.cuda.device_count())
    from support import quick_config

    callbacks = [{"class_path": "probes.SyncChecker", "init_args": {"path": str(tmp_path / "sync.jsonl")}}]
    strategy = {
        "class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
        "init_args": {"data_parallel_size": devices, "tensor_parallel_size": 1},
    }
    path = quick_config(
        tmp_path, quickstart_model_dir, steps=3, callbacks=callbacks, devices=devices, strategy=strategy
    )
    config = yaml.safe_load(path.read_text())
    config["trainer"]["accelerator"] = "gpu"
    config["trainer"]["callbacks"][0]["init_args"]["engine"]["kwargs"] = {"device": "cuda"}
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "tests" / "training"), str(REPO_ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    syncs = [json.loads(line) for line in Path(tmp_path / "sync.jsonl").read_text().splitlines()]
    assert syncs and all(s["mismatched"] == [] for s in syncs), syncs


def test_bf16_engine_matches_policy_greedy(tiny_model_dir, policy_model):
    from lit_agentrl.engines.hf import TransformersEngine

    engine = TransformersEngine(str(tiny_model_dir), device="cuda", dtype="bfloat16")
    try:
        out = asyncio.run(
            engine.async_generate(
                input_ids=[5, 6, 7], sampling_params={"temperature": 0, "max_new_tokens": 4}, return_logprob=True
            )
        )
    finally:
        engine.shutdown()
    assert len(out["output_ids"]) >= 1 and all(lp[0] <= 0 for lp in out["meta_info"]["output_token_logprobs"])
