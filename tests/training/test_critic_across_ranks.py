"""``gae`` on two data-parallel ranks is ``gae`` on one: the advantages are whitened over every rank's turns, and the
critic's replicas take the step one critic takes over all the turns (two gloo processes against one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import free_port, gloo_data_parallel_module, two_turns

from lit_agentrl.config.training import Loss
from lit_agentrl.training.batching import TrainingSample, prepare_samples
from lit_agentrl.training.critic import ValueHead, fit_critic

pytestmark = pytest.mark.slow  # starts two processes

GAMES = [(3, 6, 1.0, [0.5, 0.25]), (8, 7, 0.0, [0.5, 0.75]), (3, 5, 0.0, [0.25, 0.5]), (8, 7, 1.0, [0.0, 0.0])]
"""(first token, second token, reward, the critic's values) of four games: two on each rank."""


def advantages(indices: list[int], pool=None) -> list[list[float] | None]:
    games = [two_turns(0, *GAMES[i][:3], group=g) for g, i in enumerate(indices)]

    def values(samples: list[TrainingSample]) -> list[list[float]]:
        return [GAMES[i][3] for i in indices]

    prepare_samples(games, "sample", advantage="gae", lam=0.5, pool=pool, turn_values=values)
    return [g.turn_advantages for g in games]


def critic_after_a_step(features: torch.Tensor, targets: torch.Tensor, group=None) -> torch.Tensor:
    torch.manual_seed(0)
    head = ValueHead(4)
    optimizer = torch.optim.AdamW(head.parameters(), lr=0.1)
    fit_critic(head, optimizer, features, targets, group)
    return torch.cat([p.detach().flatten() for p in head.parameters()])


FEATURES = torch.arange(24, dtype=torch.float32).reshape(6, 4) / 10
TARGETS = torch.tensor([0.0, 1.0, 0.5, 0.25, 1.0, 0.0])


def worker(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    with gloo_data_parallel_module(rank, port, model_dir, Loss(advantage="gae")) as module:
        share = slice(0, 2) if rank == 0 else slice(2, 6)  # unequal shares of the critic's turns
        results = {
            "advantages": advantages([2 * rank, 2 * rank + 1], module._episode_pool()),
            "critic": critic_after_a_step(FEATURES[share], TARGETS[share], dist.group.WORLD),
        }
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")


def test_two_ranks_take_one_ranks_step(tiny_model_dir, tmp_path):
    mp.spawn(worker, args=(free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    whole = advantages([0, 1, 2, 3])
    got = ranks[0]["advantages"] + ranks[1]["advantages"]
    assert [x for a in got for x in a] == pytest.approx([x for a in whole for x in a], rel=1e-9)
    alone = advantages([0, 1])  # rank 0's games whitened alone differ: the test would see a per-rank whitening
    assert [x for a in alone for x in a] != pytest.approx([x for a in whole[:2] for x in a], rel=1e-3)
    one = critic_after_a_step(FEATURES, TARGETS)
    torch.testing.assert_close(ranks[0]["critic"], one)
    torch.testing.assert_close(ranks[1]["critic"], one)
