"""DAPO's dynamic sampling: keep only the prompt groups that carry a gradient, drawing more prompts until there are
enough (``RolloutCallback.train.dynamic_sampling``).

A group whose successful trajectories all got the same reward has zero advantage everywhere: training on it only
dilutes the loss. Each round generates one more step's worth of prompts (every rank its share) until the step has
``prompts_per_step`` informative groups over all ranks, or ``dynamic_max_rounds`` extra rounds are spent; each rank
then keeps at most its share of informative groups, in the order they were drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lit_agentrl.rollout.manager import summarize
from lit_agentrl.types import RolloutBatch, Trajectory


def informative_groups(trajectories: Sequence[Trajectory]) -> list[int]:
    """Groups, in first-seen order, whose successful trajectories got at least two different rewards."""
    rewards: dict[int, set[float]] = {}
    for t in trajectories:
        rewards.setdefault(t.group, set())
        if not t.failed:
            rewards[t.group].update(t.all_rewards)
    return [group for group, seen in rewards.items() if len(seen) > 1]


@dataclass
class DynamicRollout:
    rows: list[Mapping[str, Any]]  # the rows kept, in order; trajectory ``group`` indexes them
    rollout: RolloutBatch  # the kept groups' trajectories
    generated: list[Trajectory]  # every trajectory generated this step (for the rollout metrics)
    rounds: int  # extra rounds spent
    dropped_groups: int  # groups generated and not kept


def dynamic_rollout(
    rows: Sequence[Mapping[str, Any]],
    generate: Callable[[Sequence[Mapping[str, Any]], int], RolloutBatch],
    draw_extra: Callable[[], list[dict[str, Any]]],
    global_sum: Callable[[float], float],
    max_rounds: int,
) -> DynamicRollout:
    """Generate for ``rows`` (round 0), then for extra rows while the informative groups over all ranks
    (``global_sum`` of each rank's count, capped at its share) fall short of the step's prompts.

    ``generate(rows, round)`` returns a rollout whose groups index ``rows``; every rank must call this together
    (``global_sum`` is collective, and all ranks take the same number of rounds).
    """
    share = len(rows)
    target = global_sum(float(share))
    all_rows: list[Mapping[str, Any]] = list(rows)
    first = generate(rows, 0)
    generated, seconds, reward_seconds = list(first.trajectories), first.stats.seconds, first.stats.reward_seconds
    rounds = 0
    while rounds < max_rounds and global_sum(float(min(len(informative_groups(generated)), share))) < target:
        rounds += 1
        extra_rows = draw_extra()
        extra = generate(extra_rows, rounds)
        for t in extra.trajectories:
            t.group += len(all_rows)
        all_rows += extra_rows
        generated += extra.trajectories
        seconds += extra.stats.seconds
        reward_seconds += extra.stats.reward_seconds
    stats = summarize(generated, seconds)  # the step's statistics cover every round
    stats.reward_seconds = reward_seconds
    kept = informative_groups(generated)[:share]
    renumber = {group: i for i, group in enumerate(kept)}
    trajectories = []
    for t in generated:
        if t.group in renumber:
            t.group = renumber[t.group]
            trajectories.append(t)
    return DynamicRollout(
        rows=[all_rows[group] for group in kept],
        rollout=RolloutBatch(trajectories, stats, first.temperature),
        generated=generated,
        rounds=rounds,
        dropped_groups=len(all_rows) - len(kept),
    )
