"""Two ranks share one tensor-parallel SGLang engine, end to end on CPU: real SGLang, real processes.

Rank 0 (its group's first rank) starts an SGLang server with ``--tp-size 2``; both ranks reach it over HTTP and
send their own prompts; rank 0 alone pushes new weights, and both then generate from them. SGLang's CPU path
needs two settings for tp > 1 on a one-NUMA-node machine without AMX: a thread binding per rank
(``SGLANG_CPU_OMP_THREADS_BIND``) and NCCL left unloadable (``SGLANG_NCCL_SO_PATH``), so its workers all-reduce
over gloo; on GPUs neither is needed.
"""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import SGLANG_CPU, SGLANG_SHIM, free_port, free_port_with_partner, require_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
PROMPTS = [[5, 6, 7], [20, 21, 22, 23]]  # one per rank


def rank_main(rank: int, model_dir: str, init_port: int, group_port: int, out: str) -> None:
    from transformers import AutoModelForCausalLM

    from lit_agentrl.bridge.weights import sync_weights
    from lit_agentrl.engines import build_engines
    from lit_agentrl.engines.placement import EnginePlacement

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{init_port}", rank=rank, world_size=2)
    loop = asyncio.new_event_loop()
    (engine,) = build_engines(
        "sglang",
        model_dir,
        placement=EnginePlacement(rank, rank, 2, 2),
        tp_size=2,
        group_port=group_port,
        disable_custom_all_reduce=True,
        **SGLANG_CPU,
    )
    try:
        generate = engine.async_generate(input_ids=PROMPTS[rank], sampling_params=GREEDY)
        before = loop.run_until_complete(generate)["output_ids"]
        dist.barrier()
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        with torch.no_grad():
            model.get_input_embeddings().weight.zero_()  # every logit equal: greedy picks token 0
        sync_weights(model, [engine] if engine.owner else [])  # every rank gathers, the owner pushes
        dist.barrier()
        generate = engine.async_generate(input_ids=PROMPTS[rank], sampling_params=GREEDY)
        after = loop.run_until_complete(generate)["output_ids"]
        dist.barrier()  # the owner stops the server only when both ranks are done
        record = {"rank": rank, "url": engine.url, "owner": engine.owner, "before": before, "after": after}
        Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    finally:
        engine.shutdown()
        dist.destroy_process_group()


def test_two_ranks_share_a_tp2_server_started_and_fed_by_the_first(tiny_model_dir, policy_model, tmp_path, monkeypatch):
    require_sglang()
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0|1")
    monkeypatch.setenv("SGLANG_NCCL_SO_PATH", "/nonexistent/libnccl.so.2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SGLANG_SHIM), os.environ.get("PYTHONPATH", "")]))
    for attempt in (1, 2):
        group_port = free_port_with_partner(100)  # the server's port; its workers rendezvous 100 above
        try:
            mp.spawn(rank_main, args=(str(tiny_model_dir), free_port(), group_port, str(tmp_path)), nprocs=2, join=True)
            break
        except mp.ProcessRaisedException as exc:
            # A server that died while starting (seen once in CI, exit -9, on a loaded machine) is SGLang's start,
            # not what this test checks: one more try, the first death reported with the end of its log.
            if attempt == 2 or "exited with code" not in str(exc):
                raise
            warnings.warn(f"the group's SGLang server died while starting; trying once more: {exc}", stacklevel=1)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert records[0]["url"] == records[1]["url"]
    assert [r["owner"] for r in records] == [True, False]
    for record, prompt in zip(records, PROMPTS):
        expected = policy_model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None)
        assert record["before"] == expected[0, len(prompt) :].tolist()  # each rank's own prompt, served by tp 2
        assert record["after"] == [0] * 6  # the weights rank 0 pushed reached the server both ranks use
