"""Chunked log-probs (lit_agentrl.training.logprobs) give the plain path's loss and gradients without its [tokens, vocab] logits.

The plain path is ``model.logprob_chunk_tokens: 0``: full logits at every position, then
``losses.token_logprobs``. The chunked one projects only the trained positions, a few tokens at a time, inside
activation checkpoints. Both run through ``GRPOModule.accumulate_gradients`` on the same weights and samples.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lit_agentrl.config.training import Compute, Loss
from lit_agentrl.training.batching import TrainingSample
from lit_agentrl.training.logprobs import check_chunked_head, model_token_logprobs
from lit_agentrl.training.losses import AGGREGATIONS
from lit_agentrl.training.module import GRPOModule


def make_samples(vocab: int, seed: int = 0) -> list[TrainingSample]:
    """Multi-turn-like samples: prompt, a model turn, an environment turn (not trained), another model turn."""
    rng = random.Random(seed)
    samples = []
    for i in range(6):
        spans = [(rng.randint(3, 9), 0), (rng.randint(2, 8), 1), (rng.randint(1, 4), 0), (rng.randint(1, 6), 1)]
        mask = [m for length, m in spans for _ in range(length)]
        ids = [rng.randrange(vocab) for _ in range(len(mask) + 1)]
        old = [rng.uniform(-4.0, -0.5) if m else 0.0 for m in mask]
        samples.append(TrainingSample(ids[:-1], ids[1:], mask, old, advantage=rng.uniform(-1.5, 1.5) + 0.1 * i))
    return samples


def gradients(
    module: GRPOModule, samples: list[TrainingSample], chunk_tokens: int, temperature: float = 1.0
) -> tuple[dict, dict]:
    module.compute = dataclasses.replace(module.compute, logprob_chunk_tokens=chunk_tokens)
    module.policy.zero_grad(set_to_none=True)
    stats = module.accumulate_gradients(samples, temperature=temperature)
    grads = {name: p.grad.clone() for name, p in module.policy.named_parameters() if p.grad is not None}
    return stats, grads


@pytest.fixture(scope="module")
def samples(tiny_model_dir) -> list[TrainingSample]:
    from transformers import AutoConfig

    return make_samples(AutoConfig.from_pretrained(tiny_model_dir).vocab_size)


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_chunked_loss_and_gradients_equal_the_full_logits_path(tiny_model_dir, samples, aggregation, packing):
    torch.manual_seed(0)
    module = GRPOModule(
        str(tiny_model_dir),
        loss=Loss(aggregation=aggregation, norm_length=16),
        compute=Compute(micro_batch_tokens=64, sequence_packing=packing),
    )
    module.configure_model()
    plain_stats, plain = gradients(module, samples, chunk_tokens=0)
    chunked_stats, chunked = gradients(module, samples, chunk_tokens=3)  # many chunks per micro-batch
    assert plain.keys() == chunked.keys() and len(plain) == len(list(module.policy.parameters()))
    for name in plain:
        torch.testing.assert_close(chunked[name], plain[name], rtol=1e-4, atol=1e-6, msg=name)
    for key in ("train/loss", "train/entropy", "train/ratio_mean", "train/approx_kl", "train/clip_frac"):
        assert chunked_stats[key] == pytest.approx(plain_stats[key], rel=1e-5, abs=1e-7), key


def test_entropy_bonus_kl_and_temperature_through_the_chunks(tiny_model_dir, samples):
    torch.manual_seed(0)
    module = GRPOModule(
        str(tiny_model_dir), loss=Loss(entropy_coef=0.05, kl_coef=0.1), compute=Compute(micro_batch_tokens=64)
    )
    module.configure_model()
    with torch.no_grad():  # a policy that has moved from the reference, so the KL term has a gradient
        for param in module.policy.parameters():
            param.add_(0.01 * torch.randn_like(param))
    plain_stats, plain = gradients(module, samples, chunk_tokens=0, temperature=0.7)
    chunked_stats, chunked = gradients(module, samples, chunk_tokens=5, temperature=0.7)
    for name in plain:
        torch.testing.assert_close(chunked[name], plain[name], rtol=1e-4, atol=1e-6, msg=name)
    assert plain_stats["train/kl"] > 0
    for key in ("train/loss", "train/entropy", "train/kl"):
        assert chunked_stats[key] == pytest.approx(plain_stats[key], rel=1e-5), key


class LargestLogits(TorchDispatchMode):
    """Records the most elements of any logits-like tensor an operation returns: last dimension the vocabulary, and
    not the head's weight (transposed, [hidden, vocab])."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.vocab, self.weight_shape, self.most = vocab, (hidden, vocab), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.dim() and tensor.shape[-1] == self.vocab:
                if tuple(tensor.shape) == self.weight_shape:
                    continue
                self.most = max(self.most, tensor.numel())
        return out


def test_chunked_logits_never_exceed_one_chunk(policy_model):
    vocab = policy_model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 40))
    targets = torch.randint(0, vocab, (2, 40))
    positions = torch.zeros(2, 40, dtype=torch.bool)
    positions[:, 10:] = True  # 60 trained tokens of 80
    inputs = {"input_ids": ids, "use_cache": False}
    sizes = {}
    for chunk in (0, 4):
        with LargestLogits(vocab, policy_model.config.hidden_size) as largest:
            out = model_token_logprobs(policy_model, inputs, targets, positions, chunk_tokens=chunk, entropy_grad=True)
            (out.logprobs.sum() + out.entropy.sum()).backward()
        sizes[chunk] = largest.most
    assert sizes[0] >= 80 * vocab  # the plain path: logits at every position
    assert sizes[4] <= 4 * vocab < sizes[0]  # chunked: one chunk's logits at a time, forward and backward


def test_a_model_that_changes_its_logits_after_the_head_is_refused(policy_model):
    def soft_cap(module, args, output):
        output.logits = 5.0 * torch.tanh(output.logits / 5.0)
        return output

    check_chunked_head(policy_model, chunk_tokens=4)  # the plain model passes
    handle = policy_model.register_forward_hook(soft_cap)
    try:
        with pytest.raises(ValueError, match="logprob_chunk_tokens: 0"):
            check_chunked_head(policy_model, chunk_tokens=4)
        check_chunked_head(policy_model, chunk_tokens=0)  # the plain path needs no check
    finally:
        handle.remove()


def test_bad_chunk_setting_names_the_key(tiny_model_dir):
    with pytest.raises(ValueError, match=r"model\.compute\.logprob_chunk_tokens must be >= 0"):
        Compute(logprob_chunk_tokens=-1)
