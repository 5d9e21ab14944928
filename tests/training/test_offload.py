"""Colocated offload: parameters, gradients and optimizer state leave for host memory and come back bit-exact, and
training after the round trip equals training without it, in one process and under FSDP2 on two.

On CPU "host" and "device" are both the CPU, so the move is seen as new storage (``data_ptr``) holding equal values;
every move copies, so a no-op or a move that FSDP2 does not register would fail here.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import free_port
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, Qwen3Config

from lit_agentrl.bridge.offload import TrainerOffload
from lit_agentrl.training.loading import fully_shard_layers

CPU = torch.device("cpu")


def tiny_model(vocab_size: int = 256, tied: bool = False) -> torch.nn.Module:
    config = Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=vocab_size, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def batch(vocab_size: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, 12), generator=torch.Generator().manual_seed(seed))


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    """One update; the gradients are left in place (as after ``optimizer.step()``), so the offload moves them too."""
    optimizer.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits[:, :-1].float()
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)).backward()
    optimizer.step()


def tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every parameter, gradient and optimizer-state tensor, by a readable name."""
    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        out[name] = param
        if param.grad is not None:
            out[f"{name}.grad"] = param.grad
        for key, value in optimizer.state[param].items():
            out[f"{name}.{key}"] = value
    return out


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def nbytes(tensor: torch.Tensor) -> int:
    return local(tensor).numel() * local(tensor).element_size()


def snapshot(named: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, int, torch.Tensor]]:
    """name -> (the object, its storage address, a copy of its local values)."""
    return {n: (t, local(t).untyped_storage().data_ptr(), local(t).detach().clone()) for n, t in named.items()}


def assert_moved(before: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer, kept: set[str]) -> None:
    """Same names, same parameter objects, new storage (except ``kept``), bit-identical values, same placements."""
    after = tensors(model, optimizer)
    assert after.keys() == before.keys()
    params = dict(model.named_parameters())
    for name, tensor in after.items():
        old, ptr, values = before[name]
        if name in params or name.removesuffix(".grad") in params:  # optimizer.state is keyed by the parameter
            assert tensor is old, f"{name}: the object was replaced"
        moved = local(tensor).untyped_storage().data_ptr() != ptr
        assert moved != (name in kept), f"{name}: {'not ' if not moved else ''}moved"
        assert torch.equal(local(tensor), values), name
        assert type(tensor) is type(old), name
        if isinstance(old, DTensor):
            assert tensor.placements == old.placements and tensor.device_mesh == old.device_mesh, name


@pytest.mark.parametrize("fused", [False, True], ids=["host_step", "fused"])
def test_round_trip_is_bit_exact_and_training_continues_identically(fused):
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    ids = batch(256)
    train_step(model, optimizer, ids)
    reference_model, reference_optimizer = copy.deepcopy((model, optimizer))  # one memo: the state follows its params
    named = tensors(model, optimizer)
    assert any(n.endswith(".grad") for n in named) and any(n.endswith(".exp_avg") for n in named)
    # torch hosts AdamW's `step` on the CPU unless capturable or fused; the host step stays, a fused one moves.
    kept = {n for n in named if n.endswith(".step")} if not fused else set()
    expected = sum(nbytes(t) for n, t in named.items() if n not in kept)

    offload = TrainerOffload(model, optimizer, device=CPU)
    before = snapshot(named)
    assert offload.offload() == expected
    assert offload.offloaded and offload.offloaded_bytes == expected
    assert_moved(before, model, optimizer, kept)
    on_host = snapshot(tensors(model, optimizer))
    assert offload.offload() == 0 and offload.offloaded_bytes == expected  # already on the host: nothing moves
    assert_moved(on_host, model, optimizer, kept=set(on_host))

    assert offload.restore() == expected
    assert not offload.offloaded and offload.offloaded_bytes == 0
    # Against the host copies, which are alive while the new storage is allocated: the storage freed by the offload
    # may well be handed out again by the allocator. Their values were checked equal to the originals above.
    assert_moved(on_host, model, optimizer, kept)
    assert offload.restore() == 0

    train_step(model, optimizer, ids)
    train_step(reference_model, reference_optimizer, ids)
    for (name, param), expected_param in zip(model.named_parameters(), reference_model.parameters()):
        assert torch.equal(param, expected_param), name
    assert [p.grad is None for p in model.parameters()] == [p.grad is None for p in reference_model.parameters()]


def test_parts_move_separately_and_without_an_optimizer():
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters())
    train_step(model, optimizer, batch(256))
    offload = TrainerOffload(model, optimizer, device=CPU)
    state_bytes = sum(nbytes(v) for s in optimizer.state.values() for k, v in s.items() if k != "step")
    assert offload.offload_optimizer() == state_bytes and offload.offloaded_bytes == state_bytes
    assert offload.offload_optimizer() == 0
    param_bytes = sum(nbytes(p) + nbytes(p.grad) for p in model.parameters())
    assert offload.offload() == param_bytes  # the parameters (and gradients) only
    assert offload.offloaded_bytes == state_bytes + param_bytes
    assert offload.restore() == state_bytes + param_bytes and not offload.offloaded

    bare = TrainerOffload(tiny_model(), None, device="cpu")
    assert bare.offload_optimizer() == 0
    params = sum(nbytes(p) for p in bare.model.parameters())
    assert bare.offload() == params and bare.offloaded_bytes == params
    assert bare.restore() == params and not bare.offloaded


def test_a_tied_parameter_moves_once_and_stays_tied():
    model = tiny_model(tied=True)
    head = model.lm_head.weight
    assert head is model.model.embed_tokens.weight
    ptr, values = head.data_ptr(), head.detach().clone()
    offload = TrainerOffload(model, None, device=CPU)
    assert offload.offload() == sum(nbytes(p) for p in model.parameters())  # parameters() lists it once
    assert model.lm_head.weight is head and model.model.embed_tokens.weight is head
    assert head.data_ptr() != ptr and torch.equal(head, values)


# --- FSDP2 on two gloo processes ---------------------------------------------------------------------------------

VOCAB = 257  # odd: the embedding and head shard unevenly, so rank 1's shards are padded (FSDP re-pads after a move)


def fsdp_model(mesh) -> torch.nn.Module:
    model = tiny_model(VOCAB)
    fully_shard_layers(model, mesh, "float32")
    return model


def shard_registrations(model: torch.nn.Module) -> list[tuple[str, bool]]:
    """Per FSDP parameter: whether FSDP's flat shard (what its all-gather reads) is the parameter's own storage."""
    out = []
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        for group in state()._fsdp_param_groups if state else ():
            for fsdp_param in group.fsdp_params:
                shard = fsdp_param.sharded_param._local_tensor
                same = fsdp_param._sharded_param_data.untyped_storage().data_ptr() == shard.untyped_storage().data_ptr()
                out.append((fsdp_param._param_fqn, same or shard.numel() == 0))
    return out


def full(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.full_tensor() if isinstance(t, DTensor) else t.clone() for n, t in named.items()}


def fsdp_worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("data_parallel",))
        ids = batch(VOCAB, seed=rank)  # each rank its own data
        results: dict[str, object] = {}
        for name, round_trip in (("reference", False), ("offloaded", True)):
            model = fsdp_model(mesh)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            train_step(model, optimizer, ids)
            if round_trip:
                named = tensors(model, optimizer)
                assert all(isinstance(t, DTensor) for n, t in named.items() if not n.endswith(".step"))
                assert any(n.endswith(".grad") for n in named)
                kept = {n for n in named if n.endswith(".step")}
                before = snapshot(named)
                offload = TrainerOffload(model, optimizer, device=CPU)
                expected = sum(nbytes(t) for n, t in named.items() if n not in kept)
                assert offload.offload() == expected == offload.offloaded_bytes
                assert_moved(before, model, optimizer, kept)
                on_host = snapshot(tensors(model, optimizer))  # see the single-process test: not `before`
                assert offload.restore() == expected
                assert_moved(on_host, model, optimizer, kept)
                results["registrations"] = shard_registrations(model)
            train_step(model, optimizer, ids)
            with torch.no_grad():  # a forward after the second update all-gathers FSDP's registered shards
                results[f"{name}.logits"] = model(input_ids=ids).logits
            results[name] = full(tensors(model, optimizer))
        if rank == 1:  # the rank with padded shards
            torch.save(results, Path(out_dir) / "fsdp.pt")
        dist.barrier()  # neither rank closes its connections while the other still uses them
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # starts two processes: 32-45 s on two slow cores, most of it importing transformers
def test_fsdp2_round_trip_keeps_shards_registered_and_training_identical(tmp_path):
    mp.spawn(fsdp_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    results = torch.load(tmp_path / "fsdp.pt")
    registrations = results["registrations"]
    assert len(registrations) == len(list(tiny_model(VOCAB).parameters()))
    assert all(same for _, same in registrations), [fqn for fqn, same in registrations if not same]
    assert results["offloaded"].keys() == results["reference"].keys()
    for name, tensor in results["reference"].items():
        assert torch.equal(results["offloaded"][name], tensor), name
    assert torch.equal(results["offloaded.logits"], results["reference.logits"])
