"""Under FSDP2 the policy loads sharded: its shards equal ``from_pretrained``'s weights exactly, and a rank other
than 0 never holds a full copy (its peak host memory grows by well under one).

A Qwen3 of about 125M parameters (476 MiB in fp32) is saved once; two gloo processes load it through
``GRPOModule.configure_model`` as ``fit`` does, then again with a reference copy (``kl_coef > 0``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import free_port
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from lit_agentrl.config.training import Compute, Loss
from lit_agentrl.training.module import GRPOModule

pytestmark = pytest.mark.slow  # saves a 536 MB model and starts two processes


def save_model(path: Path) -> int:
    config = Qwen3Config(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, head_dim=64, tie_word_embeddings=False, dtype="float32",
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(path)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def memory_status(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, in bytes. Not ``ru_maxrss``: it survives exec, so a
    spawned worker would report its parent's peak."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields[field].split()[0]) * 1024


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM restarts from the current RSS


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def worker(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("data_parallel",))
        plain = Compute(sequence_packing=False, logprob_chunk_tokens=0)  # no load-time check forwards
        module = GRPOModule(model_dir, compute=plain)
        module._device_mesh = mesh  # as ModelParallelStrategy does before configure_model
        reset_peak()
        before = memory_status("VmRSS")
        module.configure_model()
        grown = memory_status("VmHWM") - before
        loaded = {"policy": full_state(module.policy), "buffers": dict(module.policy.named_buffers())}
        del module
        with_reference = GRPOModule(model_dir, loss=Loss(kl_coef=0.1), compute=plain)
        with_reference._device_mesh = mesh
        with_reference.configure_model()
        assert with_reference.reference is not None
        loaded["reference"] = full_state(with_reference.reference)
        if rank == 0:
            torch.save(loaded, Path(out_dir) / "loaded.pt")
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"grown": grown}))
        dist.barrier()  # neither rank closes its connections while the other still uses them
    finally:
        dist.destroy_process_group()


def test_sharded_load_equals_from_pretrained_without_a_full_copy_per_rank(tmp_path):
    model_dir = tmp_path / "model"
    full_bytes = save_model(model_dir)
    assert full_bytes > 100e6 * 4
    mp.spawn(worker, args=(free_port(), str(model_dir), str(tmp_path)), nprocs=2, join=True)

    expected = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    loaded = torch.load(tmp_path / "loaded.pt")
    state = expected.state_dict()
    for copy in ("policy", "reference"):
        assert loaded[copy].keys() == state.keys()
        for name, tensor in state.items():
            assert torch.equal(loaded[copy][name], tensor), f"{copy}: {name}"
    for name, buffer in expected.named_buffers():  # recomputed, not read: rotary inv_freq
        assert torch.equal(loaded["buffers"][name], buffer), name

    grown = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text())["grown"] for rank in (0, 1)}
    print(f"full copy {full_bytes / 2**20:.0f} MiB; peak host memory grown while loading the policy: "
          f"rank 0 {grown[0] / 2**20:.0f} MiB, rank 1 {grown[1] / 2**20:.0f} MiB")  # fmt: skip
    # Rank 1 holds its half plus one broadcast tensor at a time (measured: 0.75 of a copy, the untied embedding and
    # head being 40% of this model); loading whole, as before, it held a full copy before sharding.
    assert grown[1] < 0.9 * full_bytes
