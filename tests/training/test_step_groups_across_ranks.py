"""``model.loss.step_groups: batch`` forms its step groups over the whole step's batch, not each data-parallel rank's
share of it: two gloo processes (the policy's FSDP2 mesh, as ``ModelParallelStrategy`` sets it) give each game the
turn advantages one process gives it over all the games, and a rank whose every trajectory failed still takes its part
in the gathering (the other rank does not wait on it forever)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from support import free_port, gloo_data_parallel_module, two_turns

from lit_agentrl.config.training import Loss
from lit_agentrl.training.batching import prepare_samples
from lit_agentrl.types import Trajectory

pytestmark = pytest.mark.slow  # starts two processes

GAMES = [(3, 6, 1.0), (8, 7, 0.0), (3, 5, 0.0), (8, 7, 1.0)]
"""(first token, second token, reward) of four games of one prompt, each its own prompt group: the first two on rank
0, the last two on rank 1. Their second turns share a context only with the other rank's games."""


def game(index: int, group: int) -> Trajectory:
    first, second, reward = GAMES[index]
    return two_turns(0, first, second, reward, group)


def turn_advantages(games: list[Trajectory], pool=None) -> tuple[list[list[float] | None], dict[str, float]]:
    prepared = prepare_samples(games, "none", advantage="gigpo", gamma=1.0, step_groups="batch", pool=pool)
    return [g.turn_advantages for g in games], prepared.turn_metrics


def worker(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    with gloo_data_parallel_module(rank, port, model_dir, Loss(advantage="gigpo", step_groups="batch")) as module:
        pool = module._episode_pool()
        # Each rank numbers its own prompt groups from 0, as the rollout does.
        share = [game(2 * rank, 0), game(2 * rank + 1, 1)]
        results = {"shared": turn_advantages(share, pool)}
        failed = Trajectory(group=0, sample=0, agent_name="two_turns", failed=True)
        results["one rank failed"] = turn_advantages(share if rank == 0 else [failed], pool)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")


def test_two_ranks_give_the_advantages_of_the_whole_batch(tiny_model_dir, tmp_path):
    mp.spawn(worker, args=(free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    whole, metrics = turn_advantages([game(i, i) for i in range(4)])
    # By hand (std none, omega 1, groups of one: no episode term): every first turn comes from the prompt, returns
    # 1, 0, 0, 1 -> +-0.5; the second turns pair across ranks, (3: returns 1, 0) and (8: returns 0, 1) -> +-0.5.
    assert whole == [[0.5, 0.5], [-0.5, -0.5], [-0.5, -0.5], [0.5, 0.5]]
    assert ranks[0]["shared"][0] + ranks[1]["shared"][0] == whole
    assert ranks[0]["shared"][1] == ranks[1]["shared"][1] == metrics  # the batch's step groups on every rank
    assert metrics["train/step_groups"] == 3.0 and metrics["train/partnered_turns"] == 1.0
    # Rank 0's share alone: the second turns find no partner, as a single process over those two games gives.
    alone, alone_metrics = turn_advantages([game(0, 0), game(1, 1)])
    assert ranks[0]["one rank failed"] == (alone, alone_metrics) and alone == [[0.5, 0.0], [-0.5, 0.0]]
    assert ranks[1]["one rank failed"] == ([None], alone_metrics)
