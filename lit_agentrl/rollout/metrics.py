"""Rollout metrics reduced across ranks with torchmetrics, under the stable keys documented in docs/metrics.md."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torchmetrics import MaxMetric, MeanMetric, MinMetric, SumMetric

from lit_agentrl.types import AGENT_METRICS_FIELD, Trajectory


class RolloutMetrics(torch.nn.Module):
    """Per-step ``rollout/*`` values over every rank's trajectories (all ranks must call :meth:`compute`).
    ``measures_drift``: whether the trajectories carry their template drift (``RolloutCallback.health.template_drift``); without it
    ``rollout/template_drift`` is not logged, where a 0 would read as a measurement."""

    def __init__(self, measures_drift: bool = True) -> None:
        super().__init__()
        self.measures_drift = measures_drift
        self.reward = MeanMetric()
        self.reward_sq = MeanMetric()
        self.length = MeanMetric()
        self.turns = MeanMetric()
        self.tool_calls = MeanMetric()
        self.truncated = MeanMetric()
        self.flat_groups = MeanMetric()
        self.reward_min, self.reward_max = MinMetric(), MaxMetric()
        self.failed = SumMetric()
        self.drift = SumMetric()
        self.tokens_per_s = SumMetric()
        self.total = SumMetric()

    @torch.no_grad()
    def compute(self, trajectories: Sequence[Trajectory], seconds: float) -> dict[str, float]:
        ok = [t for t in trajectories if not t.failed]
        weight = float(len(ok))
        for metric, values in (
            (self.reward, [t.reward for t in ok]),
            (self.reward_sq, [t.reward**2 for t in ok]),
            (self.length, [t.num_generated_tokens for t in ok]),
            (self.turns, [t.num_turns for t in ok]),
            (self.tool_calls, [t.num_tool_calls for t in ok]),
            (self.truncated, [float(t.truncated) for t in ok]),
        ):
            metric.reset()
            metric.update(sum(values) / weight if ok else 0.0, weight=weight)
        flat = flat_groups(ok)
        self.flat_groups.reset()
        self.flat_groups.update(sum(flat) / len(flat) if flat else 0.0, weight=float(len(flat)))
        for extreme, pick in ((self.reward_min, min), (self.reward_max, max)):
            extreme.reset()
            if ok:
                extreme.update(pick(t.reward for t in ok))
        generated = sum(t.num_generated_tokens for t in ok)
        for total, value in (
            (self.failed, len(trajectories) - len(ok)),
            (self.total, len(trajectories)),
            (self.drift, sum(int(t.extra_fields.get("template_drift", 0)) for t in ok)),
            (self.tokens_per_s, generated / seconds if seconds > 0 else 0.0),
        ):
            total.reset()
            total.update(float(value))
        mean, mean_sq = _finite(self.reward.compute()), _finite(self.reward_sq.compute())
        return {
            "rollout/reward_mean": mean,
            "rollout/reward_std": math.sqrt(max(mean_sq - mean**2, 0.0)),
            "rollout/response_length_mean": _finite(self.length.compute()),
            "rollout/num_turns_mean": _finite(self.turns.compute()),
            "rollout/tool_calls_mean": _finite(self.tool_calls.compute()),
            "rollout/truncated_frac": _finite(self.truncated.compute()),
            "rollout/flat_group_frac": _finite(self.flat_groups.compute()),
            "rollout/reward_min": _finite(self.reward_min.compute()),
            "rollout/reward_max": _finite(self.reward_max.compute()),
            "rollout/failed": float(self.failed.compute()),
            "rollout/trajectories": float(self.total.compute()),
            "rollout/tokens_per_s": float(self.tokens_per_s.compute()),
            **({"rollout/template_drift": float(self.drift.compute())} if self.measures_drift else {}),
            **agent_metrics(ok),
        }


def flat_groups(trajectories: Sequence[Trajectory]) -> list[float]:
    """1.0 for each prompt group (of two or more rewards: successful trajectories and sequences scored on their own)
    whose rewards are all equal, else 0.0: such a group has zero advantages and teaches nothing."""
    rewards: dict[int, list[float]] = defaultdict(list)
    for t in trajectories:
        rewards[t.group] += t.all_rewards
    return [float(max(r) == min(r)) for r in rewards.values() if len(r) > 1]


def agent_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``agent/<agent_name>/<name>``: each agent-reported number averaged over the trajectories reporting it, all ranks.

    A trajectory may report a number only when it applies (say, success on turn 2 only for games that reached
    turn 2), so each key has its own count. Ranks may see different keys, hence one gather of the sums.
    """
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for t in trajectories:
        for name, value in (t.extra_fields.get(AGENT_METRICS_FIELD) or {}).items():
            entry = sums[f"agent/{t.agent_name}/{name}"]
            entry[0] += float(value)
            entry[1] += 1.0
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[dict[str, list[float]]] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, dict(sums))
        sums = defaultdict(lambda: [0.0, 0.0])
        for part in gathered:
            for key, (total, count) in part.items():
                sums[key][0] += total
                sums[key][1] += count
    return {key: total / count for key, (total, count) in sorted(sums.items())}


def _finite(value: torch.Tensor) -> float:
    """MeanMetric gives NaN when no rank had a successful trajectory; report 0 then."""
    v = float(value)
    return v if math.isfinite(v) else 0.0
