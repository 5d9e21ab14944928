"""A turn-level estimator's advantages laid onto tokens: each model turn of a trajectory (a run of generated tokens,
:func:`~lit_agentrl.turns.turn_spans`) gets its turn's advantage; prompt, tool and user tokens get none (they
stay out of the loss by their mask)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from lit_agentrl.training.advantage_estimators import (
    ESTIMATORS,
    AdvantageParams,
    Episode,
    Turn,
    episode_lambda_returns,
    step_group_sizes,
)
from lit_agentrl.turns import context_images, turn_anchor, turn_spans
from lit_agentrl.types import Trajectory

TURNS_LOGGED = 8
"""Turn indices with metrics of their own (an agent of many turns would otherwise log hundreds of keys)."""
FLAT = 1e-6
"""A group whose every turn's advantage is at most this far from 0 gives no gradient."""

EpisodePool = Callable[[list[Episode]], tuple[list[list[Episode]], int]]
"""Gathers every data-parallel rank's episodes: (each rank's, in rank order; this rank's index among them)."""


@dataclass
class TurnAdvantages:
    """What ``model.loss.advantage`` gives a rollout batch's trajectories."""

    per_token: list[list[float]]
    """[P + R] per trajectory: each position of ``all_token_ids`` its turn's advantage, 0 outside model turns."""
    per_turn: list[list[float]]
    """Each trajectory's advantage per model turn, in order."""
    num_flat_groups: int
    """Prompt groups whose every turn has advantage 0 (no gradient)."""
    metrics: dict[str, float]
    """The step groups and, per turn index, the advantages' spread and the turn rewards' mean (:func:`turn_metrics`)."""
    value_targets: list[list[float]]
    """``gae``: each trajectory's lambda-return per model turn, what its critic regresses on; [] otherwise."""


def turn_advantages(
    trajectories: Sequence[Trajectory],
    outcomes: Sequence[float],
    estimator: str,
    params: AdvantageParams,
    vision: tuple[int, int] | None = None,
    pool: EpisodePool | None = None,
    values: Sequence[Sequence[float]] | None = None,
) -> TurnAdvantages:
    """The advantages of ``estimator`` (a name of ``ESTIMATORS``) for trajectories scored ``outcomes`` (their rewards,
    turn rewards and overlong penalty included), each turn's context the exact token prefix before it and the images
    it shows (``vision``: a vision-language policy's ``(image_token_id, spatial_merge_size)``, needed with images).

    With ``step_groups: batch`` and a ``pool`` (several data-parallel ranks), the step groups are formed over every
    rank's episodes, so the advantages and step-group metrics are those of the whole step's batch, whatever the number
    of ranks it is split over; ``gae`` whitens over every rank's turns the same way. ``values``: the critic's V of
    each trajectory's turns, in order (``gae``)."""
    with_images = sorted({t.agent_name for t in trajectories if t.multi_modal_inputs})
    if with_images and vision is None:
        raise ValueError(
            f"agent(s) {with_images} returned images, and the policy is no vision-language model: a turn's context "
            "is its tokens and its images, whose placeholders say nothing of their pixels"
        )
    spans = [turn_spans(t.loss_mask, len(t.prompt_ids)) for t in trajectories]
    if estimator == "gae" and values is None:
        raise ValueError("model.loss.advantage: gae needs its critic's values of every turn")
    values = values if values is not None else [[0.0] * len(turns) for turns in spans]
    episodes = [
        _episode(t, turns, outcome, vision, v) for t, turns, outcome, v in zip(trajectories, spans, outcomes, values)
    ]
    pooled = pool is not None and (params.step_groups == "batch" or estimator == "gae")
    batch, own = _pooled(episodes, pool) if pooled and pool is not None else (episodes, slice(None))
    batch_per_turn = ESTIMATORS[estimator](batch, params)
    per_turn = batch_per_turn[own]
    per_token = [
        _on_tokens(len(t.all_token_ids), turns, values) for t, turns, values in zip(trajectories, spans, per_turn)
    ]
    metrics = turn_metrics(step_group_sizes(batch, params.step_groups), batch, batch_per_turn)
    targets = [episode_lambda_returns(e, params) for e in episodes] if estimator == "gae" else []
    return TurnAdvantages(per_token, per_turn, _flat_groups(episodes, per_turn), metrics, targets)


def _pooled(episodes: list[Episode], pool: EpisodePool) -> tuple[list[Episode], slice]:
    """Every rank's episodes as one batch (each prompt group numbered apart per rank, as ranks number their own
    groups), and where this rank's lie in it."""
    per_rank, rank = pool(episodes)
    ids: dict[tuple[int, int], int] = {}
    batch = [replace(e, group=ids.setdefault((r, e.group), len(ids))) for r, part in enumerate(per_rank) for e in part]
    start = sum(len(part) for part in per_rank[:rank])
    return batch, slice(start, start + len(episodes))


def turn_metrics(
    sizes: Sequence[int], episodes: Sequence[Episode], per_turn: Sequence[Sequence[float]]
) -> dict[str, float]:
    """``train/step_groups``: GiGPO's step groups of the batch (turns generated from the same context, within a
    prompt group or across the batch as ``model.loss.step_groups`` says);
    ``train/partnered_turns``: the fraction of turns in a step group of two or more (compared with a partner); for
    each of the first :data:`TURNS_LOGGED` turn indices t, ``train/turn_<t>/advantage_std`` (the advantages' spread
    over the trajectories that reached turn t) and ``train/turn_<t>/reward_mean`` (the turns' own rewards, outcome
    left out)."""
    turns = sum(sizes)
    partnered = sum(size for size in sizes if size > 1)
    metrics = {"train/step_groups": float(len(sizes)), "train/partnered_turns": partnered / turns if turns else 0.0}
    for t in range(min(TURNS_LOGGED, max((len(e.turns) for e in episodes), default=0))):
        reached = [i for i, e in enumerate(episodes) if len(e.turns) > t]
        metrics[f"train/turn_{t + 1}/advantage_std"] = statistics.pstdev(per_turn[i][t] for i in reached)
        metrics[f"train/turn_{t + 1}/reward_mean"] = statistics.fmean(episodes[i].turns[t].reward for i in reached)
    return metrics


def _episode(
    t: Trajectory, spans: list[tuple[int, int]], reward: float, vision: tuple[int, int] | None, values: Sequence[float]
) -> Episode:
    """``t`` as its turns: each turn's context, own reward and value; the outcome is what its reward holds beyond
    them."""
    own = t.turn_rewards or [0.0] * len(spans)
    turns = tuple(Turn(_anchor(t, start, vision), r, v) for (start, _), r, v in zip(spans, own, values, strict=True))
    return Episode(t.group, turns, reward - sum(own))


def _anchor(t: Trajectory, start: int, vision: tuple[int, int] | None) -> bytes:
    if not t.multi_modal_inputs or vision is None:
        return turn_anchor(t.all_token_ids, start)
    return turn_anchor(t.all_token_ids, start, context_images(t.all_token_ids, start, t.multi_modal_inputs, vision))


def _on_tokens(length: int, spans: list[tuple[int, int]], values: list[float]) -> list[float]:
    tokens = [0.0] * length
    for (start, end), value in zip(spans, values):
        tokens[start:end] = [value] * (end - start)
    return tokens


def _flat_groups(episodes: Sequence[Episode], per_turn: Sequence[Sequence[float]]) -> int:
    moving: dict[int, bool] = {}
    for episode, values in zip(episodes, per_turn):
        moving[episode.group] = moving.get(episode.group, False) or any(abs(v) > FLAT for v in values)
    return sum(not m for m in moving.values())
