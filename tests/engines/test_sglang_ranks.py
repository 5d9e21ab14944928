"""One in-process SGLang engine per rank, as on a GPU node: ranks seeded alike by ``seed_everything`` start their
engines at the same moment, each with a rendezvous port and a sampling seed of its own."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from support import SGLANG_CPU, SGLANG_SHIM, free_port, require_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

SAMPLED = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True}
PROMPT = [5, 6, 7]


def rank_main(rank: int, model_dir: str, init_port: int, out: str) -> None:
    from lit_agentrl.engines import build_engines
    from lit_agentrl.engines.placement import EnginePlacement

    os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = str(rank)  # one core each, as one GPU each
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{init_port}", rank=rank, world_size=2)
    random.seed(7)  # what seed_everything(7) does on every rank
    dist.barrier()  # as the trainer's ranks reach the callback's setup together
    (engine,) = build_engines("sglang", model_dir, seed=7, placement=EnginePlacement(rank, rank, 2, 2), **SGLANG_CPU)
    try:
        loop = asyncio.new_event_loop()
        output = loop.run_until_complete(engine.async_generate(input_ids=PROMPT, sampling_params=SAMPLED))
        args = engine._engine.server_args  # what SGLang was started with
        record = {"nccl_port": args.nccl_port, "random_seed": args.random_seed, "output": output["output_ids"]}
        Path(out, f"rank{rank}.json").write_text(json.dumps(record))
        dist.barrier()  # both engines up at once until both have answered
    finally:
        engine.shutdown()
        dist.destroy_process_group()


def test_ranks_seeded_alike_start_their_engines_together_on_ports_and_seeds_of_their_own(
    tiny_model_dir, tmp_path, monkeypatch
):
    require_sglang()
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SGLANG_SHIM), os.environ.get("PYTHONPATH", "")]))
    mp.spawn(rank_main, args=(str(tiny_model_dir), free_port(), str(tmp_path)), nprocs=2, join=True)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert records[0]["nccl_port"] != records[1]["nccl_port"]  # SGLang alone draws the same port on both ranks
    assert [r["random_seed"] for r in records] == [7, 8]  # the run's seed + the global rank
    assert records[0]["output"] != records[1]["output"]  # the same prompt, sampled apart


def test_shutting_an_engine_down_stops_its_own_processes_and_no_other_child_of_the_trainer(tiny_model_dir, monkeypatch):
    """SGLang 0.5.23's ``Engine.shutdown`` kills every child of its process; in rank 0 of a trainer those are also the
    other ranks, wandb's service, reward and sandbox workers (found by tests/rehearsal: wandb's teardown failed)."""
    import subprocess
    import sys

    import psutil

    from lit_agentrl.engines.sglang import SGLangEngine

    require_sglang()
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # as rank 1 would be
    try:
        engine = SGLangEngine(str(tiny_model_dir), **SGLANG_CPU)
        own = [psutil.Process(pid) for pid in engine._own_pids]
        assert own  # its scheduler and detokenizer
        engine.shutdown()
        assert bystander.poll() is None, "the engine's shutdown killed a process it did not start"
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in own)
    finally:
        bystander.kill()
        bystander.wait()
