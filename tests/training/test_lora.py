"""LoRA (``model.lora``): the adapters' gradients equal those of a low-rank model built by hand (packed and unpacked,
1 and 2 FSDP2 processes), only the adapters are trained, the KL reference is the base, and what the engines get
(merged weights or the adapters alone) is the policy.

The hand-built model is the plain base with each targeted linear replaced by ``W x + alpha/r B (A x)`` with A and B
as parameters of its own: no peft in it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import free_port
from torch.distributed.device_mesh import init_device_mesh

from lit_agentrl.bridge.lora import adapter_named_parameters, merged_named_parameters
from lit_agentrl.config.training import Compute, Lora, Loss
from lit_agentrl.training.batching import TrainingSample
from lit_agentrl.training.lora import adapters_disabled
from lit_agentrl.training.module import GRPOModule

LORA = Lora(rank=4, alpha=16, base_dtype="float32", target_modules=("q_proj", "v_proj", "down_proj"))
SCALE = 16 / 4
BUDGET = 64


class LowRank(torch.nn.Module):
    """A frozen linear plus ``scale * B A``: LoRA written out."""

    def __init__(self, base: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.A, self.B = torch.nn.Parameter(a.clone()), torch.nn.Parameter(b.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + SCALE * (x @ self.A.T) @ self.B.T


def make_samples(vocab: int, lengths=(5, 7, 3, 9, 31, 40)) -> list[TrainingSample]:
    g = torch.Generator().manual_seed(0)
    samples = []
    for length in lengths:
        ids = torch.randint(3, vocab, (length + 1,), generator=g).tolist()
        mask = [0] * (length // 3) + [1] * (length - length // 3)
        old = (-torch.rand(length, generator=g)).tolist()
        samples.append(TrainingSample(ids[:-1], ids[1:], mask, old, float(torch.randn(1, generator=g))))
    return samples


def lora_module(model_dir: str, packing: bool = True, **settings) -> GRPOModule:
    """The LoRA policy, its B set to seeded values (peft starts B at 0, where A would get no gradient)."""
    module = GRPOModule(model_dir, compute=Compute(micro_batch_tokens=BUDGET, sequence_packing=packing), **settings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # peft draws A from the global generator: the same adapters whatever ran before
        module.configure_model()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in module.policy.named_parameters():
            if "lora_B" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=g))
    return module


def hand_built(model_dir: str, lora: GRPOModule, packing: bool) -> GRPOModule:
    module = GRPOModule(model_dir, compute=Compute(micro_batch_tokens=BUDGET, sequence_packing=packing))
    module.configure_model()
    module.policy.requires_grad_(False)
    adapters = dict(lora.policy.named_parameters())
    for name, child in list(module.policy.named_modules()):
        if name.split(".")[-1] in LORA.target_modules:
            a, b = (adapters[f"{name}.lora_{x}.default.weight"].detach() for x in "AB")
            parent = module.policy.get_submodule(name.rsplit(".", 1)[0])
            setattr(parent, name.rsplit(".", 1)[1], LowRank(child, a, b))
    return module


def adapter_gradients(module: GRPOModule, samples) -> dict[str, torch.Tensor]:
    module.policy.zero_grad(set_to_none=True)
    module.accumulate_gradients(samples)
    grads = {}
    for name, param in module.policy.named_parameters():
        if param.requires_grad:
            grad = param.grad
            key = name.replace(".lora_A.default.weight", ".A").replace(".lora_B.default.weight", ".B")
            grads[key] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad.clone()
    return grads


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "unpacked"])
def test_lora_gradients_equal_a_hand_built_low_rank_model(tiny_model_dir, packing):
    lora = lora_module(str(tiny_model_dir), packing, lora=LORA)
    samples = make_samples(lora.policy.config.vocab_size)
    ours, theirs = (
        adapter_gradients(lora, samples),
        adapter_gradients(hand_built(str(tiny_model_dir), lora, packing), samples),
    )
    layers = lora.policy.config.num_hidden_layers
    assert len(ours) == 2 * layers * len(LORA.target_modules) and ours.keys() == theirs.keys()
    for name, grad in ours.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grad, theirs[name], atol=1e-6, rtol=1e-4, msg=name)


def test_only_the_adapters_train_in_float32_on_a_frozen_bfloat16_base(tiny_model_dir):
    module = GRPOModule(str(tiny_model_dir), lora=Lora(rank=2), loss=Loss(kl_coef=0.1))
    module.configure_model()
    trained = {n: p for n, p in module.policy.named_parameters() if p.requires_grad}
    frozen = {n: p for n, p in module.policy.named_parameters() if not p.requires_grad}
    assert trained and all("lora_" in n and p.dtype == torch.float32 for n, p in trained.items())
    assert all(p.dtype == torch.bfloat16 for p in frozen.values())
    module._trainer = SimpleNamespace(max_steps=10)  # what configure_optimizers reads of its Trainer
    optimizer = module.configure_optimizers()["optimizer"]
    assert [p for group in optimizer.param_groups for p in group["params"]] == list(trained.values())
    assert module.reference is None  # the KL's reference is the base: no second copy


def test_the_reference_is_the_base_and_the_engines_get_the_policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    module = lora_module(str(tiny_model_dir), lora=LORA)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.tensor([[5, 9, 11, 3, 7]])
    with torch.no_grad():
        policy = module.policy(input_ids=ids).logits
        with adapters_disabled(module.policy):
            reference = module.policy(input_ids=ids).logits
        assert not torch.allclose(policy, reference, atol=1e-3)  # B is not zero: the adapters matter
        torch.testing.assert_close(reference, base(input_ids=ids).logits)
        # Merged weights, under the plain names, make the plain model compute the policy.
        merged = dict(merged_named_parameters(module.policy))
        assert merged.keys() == dict(base.named_parameters()).keys()
        base.load_state_dict(merged, strict=False)
        torch.testing.assert_close(base(input_ids=ids).logits, policy, atol=1e-5, rtol=1e-4)
    adapters = dict(adapter_named_parameters(module.policy))
    assert len(adapters) == 2 * module.policy.config.num_hidden_layers * len(LORA.target_modules)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in adapters


def worker(rank: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.tensor import distribute_tensor

        torch.manual_seed(0)  # rank 0's adapter initialisation is broadcast: seed it as the one-process run does
        module = GRPOModule(model_dir, compute=Compute(micro_batch_tokens=BUDGET), lora=LORA)
        module._device_mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("data_parallel",))
        module.configure_model()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, param in module.policy.named_parameters():
                if "lora_B" in name:
                    full = 0.1 * torch.randn(param.shape, generator=g)
                    param.to_local().copy_(distribute_tensor(full, param.device_mesh, param.placements).to_local())
        samples = make_samples(module.policy.config.vocab_size)
        grads = adapter_gradients(module, samples[:4] if rank == 0 else samples[4:])
        merged = {name: t.clone() for name, t in merged_named_parameters(module.policy)}
        # The default: a bfloat16 base sharded beside float32 adapters (FSDP2 gathers both in param_dtype).
        default = GRPOModule(model_dir, compute=Compute(micro_batch_tokens=BUDGET), lora=Lora(rank=2))
        default._device_mesh = module._device_mesh
        default.configure_model()
        mixed = adapter_gradients(default, samples[:4] if rank == 0 else samples[4:])
        dtypes = {p.to_local().dtype for p in default.policy.parameters()}
        if rank == 0:
            torch.save({"grads": grads, "merged": merged, "mixed": mixed, "dtypes": dtypes}, Path(out) / "two.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_fsdp2_processes_give_the_one_process_adapter_gradients(tiny_model_dir, tmp_path):
    mp.spawn(worker, args=(free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    two = torch.load(tmp_path / "two.pt")
    torch.manual_seed(0)
    module = lora_module(str(tiny_model_dir), lora=LORA)
    one = adapter_gradients(module, make_samples(module.policy.config.vocab_size))
    assert one.keys() == two["grads"].keys()
    for name, grad in one.items():
        torch.testing.assert_close(two["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=name)
    for name, tensor in merged_named_parameters(module.policy):  # gathered and merged the same way
        torch.testing.assert_close(two["merged"][name], tensor, msg=name)
    assert two["dtypes"] == {torch.bfloat16, torch.float32}
    assert all(torch.isfinite(g).all() and g.dtype == torch.float32 for g in two["mixed"].values())


def test_target_modules_the_model_lacks_are_named(tiny_model_dir):
    from lit_agentrl.errors import UserInputError

    module = GRPOModule(str(tiny_model_dir), lora=Lora(rank=2, target_modules=("qkv_proj",)))
    with pytest.raises(UserInputError, match=r"model.lora.target_modules=\['qkv_proj'\]"):
        module.configure_model()
