"""Micro-batching by token budget gives the loss and gradients of one padded batch (within float tolerance)."""

from __future__ import annotations

import torch

from lit_agentrl.batching import TrainingSample, collate, plan_micro_batches, prepare_samples, split_mini_batches
from lit_agentrl.losses import clipped_policy_loss, token_logprobs
from lit_agentrl.types import Trajectory


def samples(vocab: int) -> list[TrainingSample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for length in (5, 40, 9, 23, 31, 7):
        ids = torch.randint(3, vocab, (length + 1,), generator=g).tolist()
        mask = [0] * 3 + [1] * (length - 3)
        old = (-torch.rand(length, generator=g)).tolist()
        out.append(TrainingSample(ids[:-1], ids[1:], mask, old, float(torch.randn(1, generator=g))))
    return out


def loss_and_grads(model, batch: list[TrainingSample], plans: list[list[int]], pad: int):
    model.zero_grad(set_to_none=True)
    denominator = float(sum(sum(s.loss_mask) for s in batch))
    total = 0.0
    for plan in plans:
        micro = collate([batch[i] for i in plan], pad)
        logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask, use_cache=False).logits
        logprobs = token_logprobs(logits, micro.targets).logprobs
        loss, _ = clipped_policy_loss(logprobs, micro.old_logprobs, micro.advantages, micro.loss_mask, denominator=denominator)
        loss.backward()
        total += float(loss)
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_micro_batches_match_one_padded_batch(policy_model):
    model = policy_model.train()
    batch = samples(model.config.vocab_size)
    pad = model.config.pad_token_id
    plans = plan_micro_batches(batch, token_budget=64)
    assert len(plans) > 1 and sorted(i for p in plans for i in p) == list(range(len(batch)))
    assert all(len(p) * max(len(batch[i]) for i in p) <= 64 or len(p) == 1 for p in plans)
    loss_micro, grads_micro = loss_and_grads(model, batch, plans, pad)
    loss_one, grads_one = loss_and_grads(model, batch, [list(range(len(batch)))], pad)
    model.zero_grad(set_to_none=True)
    model.eval()  # the session's shared policy model goes back as it was
    assert abs(loss_micro - loss_one) < 1e-5
    for name, grad in grads_one.items():
        torch.testing.assert_close(grads_micro[name], grad, atol=1e-5, rtol=1e-4)


def test_micro_batches_are_length_sorted_and_fit_the_budget():
    batch = [TrainingSample([1] * n, [1] * n, [1] * n, [0.0] * n, 0.0) for n in (50, 3, 20, 4, 21, 100)]
    plans = plan_micro_batches(batch, token_budget=48)
    lengths = [[len(batch[i]) for i in p] for p in plans]
    assert lengths == [[3, 4], [20, 21], [50], [100]]  # a sequence over the budget gets its own micro-batch


def test_prepare_samples_leaves_failed_trajectories_out_of_groups():
    ok = [Trajectory(0, i, "a", [1, 2], [1, 2, 3, 4], [0, 0, 1, 1], [-0.1, -0.2], reward=float(i)) for i in range(2)]
    failed = Trajectory(0, 2, "a", failed=True, failure_reason="boom", reward=100.0)
    prepared = prepare_samples([*ok, failed])
    assert prepared.num_failed == 1 and len(prepared.samples) == 2
    assert [round(s.advantage, 4) for s in prepared.samples] == [-1.0, 1.0]  # the failed reward is not in the group
    shifted = prepared.samples[0]
    assert shifted.input_ids == [1, 2, 3] and shifted.targets == [2, 3, 4] and shifted.loss_mask == [0, 1, 1]
    assert shifted.old_logprobs == [0.0, -0.1, -0.2]


def test_split_mini_batches_covers_every_sample_once():
    parts = split_mini_batches(list(range(7)), 3)
    assert parts == [[0, 1, 2], [3, 4], [5, 6]]
