"""From trajectories to training tensors: advantages per sequence, micro-batches sized by a token budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from lit_agentrl.losses import grpo_advantages
from lit_agentrl.types import Trajectory


@dataclass
class TrainingSample:
    """One trajectory shifted for next-token training: position t predicts ``targets[t]``. All lists [T - 1]."""

    input_ids: list[int]
    targets: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float

    def __len__(self) -> int:
        return len(self.input_ids)


class PreparedSamples(NamedTuple):
    samples: list[TrainingSample]
    num_groups: int
    num_flat_groups: int
    num_failed: int


def prepare_samples(trajectories: Sequence[Trajectory], normalize_std: bool = True) -> PreparedSamples:
    """Advantages over each prompt group's successful trajectories; failed ones are left out entirely."""
    ok = [t for t in trajectories if not t.failed and t.num_generated_tokens > 0]
    if not ok:
        return PreparedSamples([], 0, 0, len(trajectories))
    rewards = torch.tensor([t.reward for t in ok], dtype=torch.float64)
    groups = torch.tensor([t.group for t in ok])
    adv = grpo_advantages(rewards, groups, normalize_std=normalize_std)
    samples = [_shift(t, float(a)) for t, a in zip(ok, adv.advantages.tolist())]
    return PreparedSamples(samples, adv.num_groups, adv.num_flat_groups, len(trajectories) - len(ok))


def _shift(t: Trajectory, advantage: float) -> TrainingSample:
    p = len(t.prompt_ids)
    rollout_logprobs = t.response_logprobs if t.response_logprobs is not None else [0.0] * (len(t.all_token_ids) - p)
    return TrainingSample(
        input_ids=t.all_token_ids[:-1],
        targets=t.all_token_ids[1:],
        loss_mask=t.loss_mask[1:],
        old_logprobs=[0.0] * (p - 1) + list(rollout_logprobs),
        advantage=advantage,
    )


def plan_micro_batches(samples: Sequence[TrainingSample], token_budget: int) -> list[list[int]]:
    """Group sample indices into micro-batches whose padded size (rows x longest) fits ``token_budget``.

    Samples are sorted by length first, so each micro-batch holds similar lengths and pads little. A
    sample longer than the budget gets a micro-batch of its own.
    """
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and len(samples[i]) * (len(current) + 1) > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class MicroBatch(NamedTuple):
    input_ids: torch.Tensor  # [B, L] right-padded
    attention_mask: torch.Tensor  # [B, L]
    targets: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, L] float
    old_logprobs: torch.Tensor  # [B, L]
    advantages: torch.Tensor  # [B]


def collate(samples: Sequence[TrainingSample], pad_id: int, device: torch.device | str = "cpu") -> MicroBatch:
    """Right-pad samples into tensors; padding carries mask 0 and never reaches the loss."""
    width = max(len(s) for s in samples)
    shape = (len(samples), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    targets = torch.full(shape, pad_id, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.float32)
    old = torch.zeros(shape, dtype=torch.float32)
    for row, s in enumerate(samples):
        n = len(s)
        ids[row, :n] = torch.tensor(s.input_ids)
        attention[row, :n] = 1
        targets[row, :n] = torch.tensor(s.targets)
        mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        old[row, :n] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    tensors = (ids, attention, targets, mask, old, advantages)
    return MicroBatch(*(t.to(device) for t in tensors))


def split_mini_batches(samples: Sequence[TrainingSample], num_mini_batches: int) -> list[list[TrainingSample]]:
    """Split one rollout's samples into ``num_mini_batches`` contiguous parts, one optimizer step each."""
    if num_mini_batches < 1:
        raise ValueError(f"mini_batches must be >= 1, got {num_mini_batches}")
    size, extra = divmod(len(samples), num_mini_batches)
    parts, start = [], 0
    for i in range(num_mini_batches):
        end = start + size + (1 if i < extra else 0)
        parts.append(list(samples[start:end]))
        start = end
    return parts
