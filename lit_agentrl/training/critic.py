"""``gae``'s critic: V(s), the return expected from a turn's context, learned across steps.

V reads the policy's final hidden state at the position that predicts a turn's first token (the context's last
token), detached: the critic learns from the policy's features without changing them, and its loss stays out of the
policy's update (no coefficient to balance, nothing for FSDP to shard). It is a small MLP with an AdamW of its own,
regressed each step on the turns' lambda-returns (:func:`~lit_agentrl.training.advantage_estimators.lambda_returns`)
with the values it gave before the step; its last layer starts at zero, so V starts at 0 everywhere. On several
data-parallel ranks each holds a replica and their gradients are summed, so every replica takes the same step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedModel

from lit_agentrl.training.batching import MicroBatch
from lit_agentrl.training.logprobs import model_hidden_states

CRITIC_WIDTH = 256
"""The MLP's hidden width (at most the policy's hidden size)."""
CRITIC_STEPS = 2
"""Full-batch AdamW steps on each rollout batch's turns."""


class ValueHead(nn.Module):
    """V(s) from a hidden state: hidden -> width -> 1, tanh between, the last layer zero at the start."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        width = min(CRITIC_WIDTH, hidden_size)
        out = nn.Linear(width, 1)
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)
        self.layers = nn.Sequential(nn.Linear(hidden_size, width), nn.Tanh(), out)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> [N]."""
        return self.layers(hidden).squeeze(-1)


def turn_starts(loss_mask: Sequence[int]) -> list[int]:
    """The positions of a shifted sample (position j predicts target j) that predict each model turn's first token:
    where a run of trained targets begins."""
    return [j for j, trained in enumerate(loss_mask) if trained and (j == 0 or not loss_mask[j - 1])]


@torch.no_grad()
def turn_start_states(
    policy: PreTrainedModel,
    micro_batches: Iterable[tuple[list[int], MicroBatch]],
    loss_masks: Sequence[Sequence[int]],
    empty: torch.Tensor,
) -> list[torch.Tensor]:
    """Per sample, [turns, H]: the policy's final hidden state at each position predicting one of its model turns'
    first token. ``micro_batches``: (the sample indices of its sequences, the micro-batch); ``loss_masks``: each
    sample's; a sample in no micro-batch gets ``empty`` ([0, H])."""
    states = [empty] * len(loss_masks)
    for order, micro in micro_batches:
        starts = torch.zeros_like(micro.sequence_index, dtype=torch.bool)
        for k, j in enumerate(order):
            picked = (micro.sequence_index == k).nonzero()[turn_starts(loss_masks[j])]
            starts[picked[:, 0], picked[:, 1]] = True
        hidden = model_hidden_states(policy, micro.model_inputs(), starts).float()
        owners = micro.sequence_index[starts]
        for k, j in enumerate(order):
            states[j] = hidden[owners == k]
    return states


def fit_critic(
    head: ValueHead,
    optimizer: torch.optim.Optimizer,
    features: torch.Tensor,
    targets: torch.Tensor,
    group: dist.ProcessGroup | None = None,
) -> dict[str, float]:
    """:data:`CRITIC_STEPS` AdamW steps of the mean squared error of ``head(features)`` [N] against ``targets`` [N]
    over every rank's turns (``group``: the data-parallel group, None on one process); returns ``train/value_loss``
    (before the steps) and ``train/value_explained_variance`` (1 - Var(G - V) / Var(G), before the steps)."""
    count = torch.tensor([float(len(targets))], device=features.device)
    if group is not None:
        dist.all_reduce(count, group=group)
    total = max(float(count), 1.0)
    first: dict[str, float] = {}
    for _ in range(CRITIC_STEPS):
        optimizer.zero_grad(set_to_none=True)
        values = head(features)
        loss = ((values - targets) ** 2).sum() / total
        loss.backward()
        if group is not None:
            for param in head.parameters():
                assert param.grad is not None
                dist.all_reduce(param.grad, group=group)
        if not first:
            first = _value_stats(values.detach(), targets, loss.detach(), group)
        optimizer.step()
    return first


def _value_stats(
    values: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor, group: dist.ProcessGroup | None
) -> dict[str, float]:
    """The value loss and explained variance over every rank's turns."""
    sums = torch.stack(
        [loss, targets.sum(), (targets**2).sum(), (targets - values).sum(), ((targets - values) ** 2).sum()]
    ).to(torch.float64)
    n = torch.tensor(float(len(targets)), dtype=torch.float64, device=sums.device)
    sums = torch.cat([sums, n.unsqueeze(0)])
    if group is not None:  # each rank's loss is its share of the global mean: the shares add up
        dist.all_reduce(sums, group=group)
    loss_sum, t_sum, t_sq, e_sum, e_sq, n = sums.tolist()
    if n < 2:
        return {"train/value_loss": loss_sum}
    var_t = t_sq / n - (t_sum / n) ** 2
    var_e = e_sq / n - (e_sum / n) ** 2
    explained = 1.0 - var_e / var_t if var_t > 1e-12 else 0.0
    return {"train/value_loss": loss_sum, "train/value_explained_variance": explained}
