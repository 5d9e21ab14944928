"""The same global batch gives the same update on 1 and on 2 FSDP2 processes, for every loss aggregation (and with
the trainer's old log-probs and rollout correction, and GSPO with dual-clip), with ranks holding unequal shares
(tokens and sequences); a tensor-parallel mesh is refused rather than trained wrong.

The two processes run ``GRPOModule.accumulate_gradients`` under gloo with a real FSDP2-sharded policy; the full
gradients (gathered from the shards) must equal one process's over all the samples.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import free_port
from torch.distributed.device_mesh import init_device_mesh

from lit_agentrl.config.training import Compute, Correction, Loss
from lit_agentrl.training.batching import TrainingSample
from lit_agentrl.training.losses import AGGREGATIONS
from lit_agentrl.training.module import GRPOModule

pytestmark = pytest.mark.slow  # starts two processes

CASES = {
    **{aggregation: {"loss": Loss(aggregation=aggregation, norm_length=16)} for aggregation in AGGREGATIONS},
    # The trainer's old log-probs (recomputed under FSDP2) with TIS, and GSPO's sequence ratio with dual-clip.
    "trainer+tis": {"loss": Loss(old_logprobs="trainer"), "correction": Correction(kind="tis", threshold=1.5)},
    "gspo+dual-clip": {"loss": Loss(policy_ratio="sequence", clip_ratio_c=3.0, aggregation="seq-mean-token-mean")},
}
RANK_SHARES = ((5, 7, 3, 9), (31, 40))
"""Sample lengths per rank: 24 tokens in 4 sequences against 71 in 2 (and 1 micro-batch against 2 at 64 tokens)."""
BUDGET = 64


def make_samples(vocab: int) -> list[TrainingSample]:
    g = torch.Generator().manual_seed(0)
    samples = []
    for length in (n for share in RANK_SHARES for n in share):
        ids = torch.randint(3, vocab, (length + 1,), generator=g).tolist()
        mask = [0] * (length // 3) + [1] * (length - length // 3)
        old = (-torch.rand(length, generator=g)).tolist()
        advantage = float(torch.randn(1, generator=g))
        samples.append(TrainingSample(ids[:-1], ids[1:], mask, old, advantage, rollout_logprobs=list(old)))
    return samples


def gradients(module: GRPOModule, samples: list[TrainingSample]) -> dict[str, torch.Tensor]:
    module.policy.zero_grad(set_to_none=True)
    if module.loss.old_logprobs == "trainer":
        module.recompute_old_logprobs(samples)
    module.accumulate_gradients(samples)
    grads = {}
    for name, param in module.policy.named_parameters():
        assert param.grad is not None, name
        grad = param.grad
        grads[name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad.clone()
    return grads


def worker(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("data_parallel",))
        results: dict[str, object] = {}
        for case, settings in CASES.items():
            module = GRPOModule(model_dir, compute=Compute(micro_batch_tokens=BUDGET), **settings)
            module._device_mesh = mesh  # what ModelParallelStrategy sets before configure_model
            module.configure_model()
            samples = make_samples(module.policy.config.vocab_size)
            share = samples[: len(RANK_SHARES[0])] if rank == 0 else samples[len(RANK_SHARES[0]) :]
            results[case] = gradients(module, share)
        tp_mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("data_parallel", "tensor_parallel"))
        module = GRPOModule(model_dir)
        module._device_mesh = tp_mesh
        try:
            module.configure_model()
            results["tensor_parallel"] = "accepted"
        except ValueError as exc:
            results["tensor_parallel"] = str(exc)
        if rank == 0:
            torch.save(results, Path(out_dir) / "two_process.pt")
        dist.barrier()  # neither rank closes its connections while the other still uses them
    finally:
        dist.destroy_process_group()


def test_one_and_two_processes_give_the_same_gradients(tiny_model_dir, tmp_path):
    mp.spawn(worker, args=(free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    two = torch.load(tmp_path / "two_process.pt")
    assert "tensor_parallel_size=2 is not supported" in str(two["tensor_parallel"])
    for case, settings in CASES.items():
        module = GRPOModule(str(tiny_model_dir), compute=Compute(micro_batch_tokens=BUDGET), **settings)
        module.configure_model()
        one = gradients(module, make_samples(module.policy.config.vocab_size))
        assert one.keys() == two[case].keys()
        for name, grad in one.items():
            torch.testing.assert_close(two[case][name], grad, atol=1e-6, rtol=1e-4, msg=f"{case}: {name}")
