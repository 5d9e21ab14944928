"""From trajectories to training tensors: advantages per sequence, micro-batches sized by a token budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from lit_agentrl.config.choices import SEQUENCE_REWARDS
from lit_agentrl.config.training import Overlong
from lit_agentrl.models.processors import mrope_position_ids
from lit_agentrl.training.advantage_estimators import AdvantageParams
from lit_agentrl.training.losses import grpo_advantages
from lit_agentrl.training.turn_advantages import EpisodePool, turn_advantages
from lit_agentrl.types import TokenSequence, Trajectory


@dataclass
class TrainingSample:
    """One trajectory shifted for next-token training: position t predicts ``targets[t]``. All lists [T - 1].

    ``old_logprobs`` are the PPO ratio's denominator: the engine's log-probs (``model.old_logprobs: engine``) or the
    trainer's, recomputed before the update (``trainer``); ``rollout_logprobs`` are the engine's, kept for the
    rollout correction (None when the agent returned none).
    """

    input_ids: list[int]
    targets: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float | list[float]
    """The sequence's advantage, or each target's (a turn-level ``model.loss.advantage``)."""
    rollout_logprobs: list[float] | None = None
    multi_modal_inputs: dict[str, Any] | None = None
    """A vision-language trajectory's images (``pixel_values``, ``image_grid_thw``); None for text."""

    def __len__(self) -> int:
        return len(self.input_ids)


class PreparedSamples(NamedTuple):
    samples: list[TrainingSample]
    num_groups: int
    num_flat_groups: int
    num_failed: int
    turn_metrics: dict[str, float] = {}  # noqa: RUF012 (a NamedTuple's default, never mutated)
    """With a turn-level ``model.loss.advantage``: its step groups and per-turn figures (``turn_metrics``)."""
    value_targets: list[list[float]] = []  # noqa: RUF012
    """``gae``: the lambda-return of each turn of each trajectory ``turn_values`` was given, in its order."""


TurnValues = Callable[[list[TrainingSample]], list[list[float]]]
"""The critic's V of each model turn of each sample, in order (``gae``)."""


def prepare_samples(
    trajectories: Sequence[Trajectory],
    advantage_std: str = "sample",
    need_rollout_logprobs: bool = True,
    overlong: Overlong | None = None,
    sequence_rewards: str = "shared",
    advantage: str = "grpo",
    gamma: float = 1.0,
    step_weight: float = 1.0,
    step_groups: str = "group",
    lam: float = 1.0,
    step_first_turn: bool = True,
    vision: tuple[int, int] | None = None,
    pool: EpisodePool | None = None,
    turn_values: TurnValues | None = None,
) -> PreparedSamples:
    """Advantages over each prompt group's successful trajectories; failed ones are left out entirely.

    With ``need_rollout_logprobs`` (the old log-probs are the engine's) a trajectory whose agent returned no
    ``response_logprobs`` is an error naming the agent; otherwise its old log-probs are left for the trainer.
    ``advantage_std`` is :data:`~lit_agentrl.config.choices.ADVANTAGE_STDS`'s. ``overlong`` says what truncated trajectories
    get (see :class:`Overlong`; default: trained as they are). Every token sequence of a trajectory becomes a
    sample; ``sequence_rewards`` (:data:`SEQUENCE_REWARDS`) says how a trajectory of several sequences is scored.
    ``advantage`` other than ``grpo`` gives each model turn its own advantage (:mod:`turn_advantages`, with the
    discount ``gamma``, GiGPO's ``step_weight``, ``step_groups`` and ``step_first_turn`` and GAE's ``lam``), for
    trajectories of one token sequence; a turn's context is its tokens and, with ``vision`` (the policy's
    ``(image_token_id, spatial_merge_size)``), its images; ``pool`` gathers the other data-parallel ranks' turns,
    for step groups and ``gae``'s whitening over the whole batch. ``gae`` takes its critic's values from
    ``turn_values``, given every successful trajectory's sample.
    """
    if sequence_rewards not in SEQUENCE_REWARDS:
        raise ValueError(
            f"model.loss.sequence_rewards must be one of {list(SEQUENCE_REWARDS)}, got {sequence_rewards!r}"
        )
    overlong = overlong or Overlong()
    ok = [t for t in trajectories if not t.failed and t.num_generated_tokens > 0]
    missing = sorted({t.agent_name for t in ok for s in t.sequences if s.response_logprobs is None})
    if need_rollout_logprobs and missing:
        raise ValueError(
            f"agent(s) {missing} returned trajectories without response_logprobs, and model.old_logprobs is 'engine': "
            "return the engine's log-probs from the agent (ChatModel does), or set model.old_logprobs: trainer"
        )
    scored = sorted({t.agent_name for t in ok for s in t.other_sequences if s.reward is not None})
    if sequence_rewards == "shared" and scored:
        raise ValueError(
            f"agent(s) {scored} gave sequences rewards of their own, which model.loss.sequence_rewards: shared would "
            "not use: set model.loss.sequence_rewards: own, or leave TokenSequence.reward unset"
        )
    if not ok and (pool is None or advantage == "grpo"):  # a pool: this rank still takes part in the gathering
        return PreparedSamples([], 0, 0, len(trajectories))
    if advantage != "grpo":
        params = AdvantageParams(advantage_std, gamma, step_weight, step_groups, lam, step_first_turn)
        failed = len(trajectories) - len(ok)
        return _turn_level_samples(ok, failed, overlong, advantage, params, vision, pool, turn_values)
    # The members of each group's statistics: a trajectory (shared: all its sequences get its advantage) or, with
    # ``own``, each of its sequences, scored by its own reward when it has one. The first member of a trajectory
    # holds its main sequence.
    members: list[tuple[Trajectory, list[TokenSequence], bool]] = []
    for t in ok:
        sequences = t.sequences
        if sequence_rewards == "shared":
            members.append((t, sequences, True))
        else:
            members += [(t, [s], i == 0) for i, s in enumerate(sequences)]
    rewards = torch.tensor(
        [_member_reward(t, sequences[0]) + overlong.penalty(t.num_generated_tokens) for t, sequences, _ in members],
        dtype=torch.float64,
    )
    adv = grpo_advantages(rewards, torch.tensor([t.group for t, _, _ in members]), std=advantage_std)
    samples: list[TrainingSample] = []
    for (t, sequences, main), advantage in zip(members, adv.advantages.tolist()):
        if main:  # kept on the trajectory for the trajectory log and the viewer
            t.advantage = float(advantage)
        if overlong.mode == "mask" and t.truncated:  # in their groups' advantages above, out of the loss here
            continue
        images = t.multi_modal_inputs if main else None  # an agent's other contexts are text
        samples += [
            _shift(s, float(advantage), images if i == 0 else None)
            for i, s in enumerate(sequences)
            if s.num_generated_tokens > 0
        ]
    return PreparedSamples(samples, adv.num_groups, adv.num_flat_groups, len(trajectories) - len(ok))


def _turn_level_samples(
    ok: list[Trajectory],
    num_failed: int,
    overlong: Overlong,
    advantage: str,
    params: AdvantageParams,
    vision: tuple[int, int] | None,
    pool: EpisodePool | None,
    turn_values: TurnValues | None,
) -> PreparedSamples:
    """Samples whose tokens carry their turn's advantage (trajectories of one token sequence each)."""
    several = sorted({t.agent_name for t in ok if t.other_sequences})
    if several:
        raise ValueError(
            f"agent(s) {several} returned trajectories of several token sequences, whose turns have no one order for "
            f"model.loss.advantage: {advantage} to credit: use model.loss.advantage: grpo with such agents"
        )
    outcomes = [t.reward + overlong.penalty(t.num_generated_tokens) for t in ok]
    values = None  # without them, gae is refused by turn_advantages
    if advantage == "gae" and turn_values is not None:
        values = turn_values([_shift(t.sequences[0], 0.0, t.multi_modal_inputs) for t in ok])
    result = turn_advantages(ok, outcomes, advantage, params, vision, pool, values)
    samples = []
    for t, per_token, per_turn in zip(ok, result.per_token, result.per_turn):
        t.advantage = per_turn[0]  # the first turn's, for the trajectory log and the viewer
        t.turn_advantages = per_turn
        if overlong.mode == "mask" and t.truncated:
            continue
        samples.append(_shift(t.sequences[0], per_token, t.multi_modal_inputs))
    groups = len({t.group for t in ok})
    return PreparedSamples(samples, groups, result.num_flat_groups, num_failed, result.metrics, result.value_targets)


def _member_reward(t: Trajectory, sequence: TokenSequence) -> float:
    return t.reward if sequence.reward is None else sequence.reward


def _shift(sequence: TokenSequence, advantage: float | list[float], images: dict[str, Any] | None) -> TrainingSample:
    ids, p, logprobs = sequence.all_token_ids, len(sequence.prompt_ids), sequence.response_logprobs
    rollout = None if logprobs is None else [0.0] * (p - 1) + list(logprobs)
    return TrainingSample(
        input_ids=ids[:-1],
        targets=ids[1:],
        loss_mask=sequence.loss_mask[1:],
        old_logprobs=list(rollout) if rollout is not None else [0.0] * (len(ids) - 1),
        advantage=advantage if isinstance(advantage, float) else advantage[1:],  # per target: position t + 1
        rollout_logprobs=rollout,
        multi_modal_inputs=images,
    )


def plan_micro_batches(
    samples: Sequence[TrainingSample], token_budget: int, packing: bool = True
) -> list[list[list[int]]]:
    """Lay samples out as micro-batches of rows of sample indices, each micro-batch within ``token_budget``.

    With ``packing``, samples are packed first-fit-decreasing into rows as long as the longest sample, so a
    row holds several short sequences and almost no padding. Without it, each row holds one sample. Rows
    are then grouped longest first, so each micro-batch's rows have similar fills; a micro-batch costs
    (rows x its longest row) tokens. A row longer than the budget gets a micro-batch of its own.
    """
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]), reverse=True)
    rows = _pack_rows(order, [len(s) for s in samples], packing)
    fills = [sum(len(samples[i]) for i in row) for row in rows]
    batches: list[list[list[int]]] = []
    current: list[list[int]] = []
    width = 0
    for row, fill in sorted(zip(rows, fills), key=lambda rf: rf[1], reverse=True):
        if current and max(width, fill) * (len(current) + 1) > token_budget:
            batches.append(current)
            current, width = [], 0
        current.append(row)
        width = max(width, fill)
    if current:
        batches.append(current)
    return batches


def _pack_rows(order: list[int], lengths: list[int], packing: bool) -> list[list[int]]:
    """First-fit decreasing into rows of capacity max(lengths); ``order`` is longest first."""
    if not packing or not order:
        return [[i] for i in order]
    capacity = lengths[order[0]]
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        slot = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            rows.append([i])
            room.append(capacity - lengths[i])
        else:
            rows[slot].append(i)
            room[slot] -= lengths[i]
    return rows


class MicroBatch(NamedTuple):
    """Rows of one or more sequences each, right-padded to the longest row. All tensors [R, W].

    Position ids restart at 0 for every sequence in a row, which is how transformers models recognise
    packed sequences and keep them from attending to one another. Padding continues the last sequence's
    positions: causally after every real token, it never changes one, and it carries loss mask 0.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor  # float
    old_logprobs: torch.Tensor
    advantages: torch.Tensor  # each token carries its sequence's advantage
    sequence_index: torch.Tensor  # long: the token's sequence within the micro-batch, -1 for padding
    rollout_logprobs: torch.Tensor  # the engine's (zeros where a sample has none)
    mrope_position_ids: torch.Tensor | None = None
    """[4, R, W] for a vision-language policy (Qwen2-VL family): the text positions (by which packed sequences are
    kept apart), then the 3-D rotary positions (temporal, height, width); None for a text policy."""
    pixel_values: torch.Tensor | None = None
    """[N, D]: the images of every sequence, in row-major sequence order; None without images."""
    image_grid_thw: torch.Tensor | None = None
    """[k, 3]: their patch grids."""

    def model_inputs(self) -> dict[str, Any]:
        """Forward arguments; without a KV cache, since transformers looks for packed rows only then."""
        positions = self.mrope_position_ids if self.mrope_position_ids is not None else self.position_ids
        inputs: dict[str, Any] = {"input_ids": self.input_ids, "position_ids": positions, "use_cache": False}
        if self.pixel_values is not None:
            inputs.update(pixel_values=self.pixel_values, image_grid_thw=self.image_grid_thw)
        return inputs


def collate(
    rows: Sequence[Sequence[TrainingSample]],
    pad_id: int,
    device: torch.device | str = "cpu",
    vision: tuple[int, int] | None = None,
) -> MicroBatch:
    """Concatenate each row's samples and right-pad the rows to the longest one.

    ``vision``: a vision-language policy's ``(image_token_id, spatial_merge_size)``
    (:func:`lit_agentrl.models.processors.vision_settings`): the micro-batch then carries 4-row positions and the samples'
    images (see :class:`MicroBatch`). Samples with images need it.
    """
    if vision is None and any(s.multi_modal_inputs for row in rows for s in row):
        raise ValueError("samples with images need collate(..., vision=(image_token_id, merge_size)) of the policy")
    width = max(sum(len(s) for s in row) for row in rows)
    shape = (len(rows), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    targets = torch.full(shape, pad_id, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.float32)
    old = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    sequence = torch.full(shape, -1, dtype=torch.long)
    rollout = torch.zeros(shape, dtype=torch.float32)
    index = 0
    for r, row in enumerate(rows):
        start = 0
        for s in row:
            end = start + len(s)
            ids[r, start:end] = torch.tensor(s.input_ids)
            targets[r, start:end] = torch.tensor(s.targets)
            positions[r, start:end] = torch.arange(len(s))
            mask[r, start:end] = torch.tensor(s.loss_mask, dtype=torch.float32)
            old[r, start:end] = torch.tensor(s.old_logprobs, dtype=torch.float32)
            advantages[r, start:end] = s.advantage if isinstance(s.advantage, float) else torch.tensor(s.advantage)
            if s.rollout_logprobs is not None:
                rollout[r, start:end] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
            sequence[r, start:end] = index
            start, index = end, index + 1
        last = len(row[-1])
        positions[r, start:] = torch.arange(last, last + width - start)
    tensors = (ids, positions, targets, mask, old, advantages, sequence, rollout)
    batch = MicroBatch(*(t.to(device) for t in tensors))
    if vision is None:
        return batch
    extra = _vision(rows, positions, vision)
    pixels, grids = extra["pixel_values"], extra["image_grid_thw"]
    return batch._replace(
        mrope_position_ids=extra["mrope_position_ids"].to(device),
        pixel_values=pixels.to(device) if pixels is not None else None,
        image_grid_thw=grids.to(device) if grids is not None else None,
    )


def _vision(
    rows: Sequence[Sequence[TrainingSample]], positions: torch.Tensor, vision: tuple[int, int]
) -> dict[str, Any]:
    """4-row positions [4, R, W] and the images of a micro-batch for a Qwen2-VL-family policy."""
    token, merge = vision
    rope = positions.unsqueeze(0).repeat(3, 1, 1)
    pixels: list[torch.Tensor] = []
    grids: list[torch.Tensor] = []
    for r, row in enumerate(rows):
        start = 0
        for s in row:
            end = start + len(s)
            images = s.multi_modal_inputs
            if images:
                grid = torch.as_tensor(images["image_grid_thw"]).long().reshape(-1, 3)
                rope[:, r, start:end] = mrope_position_ids(s.input_ids, grid, token, merge)[0]
                pixels.append(torch.as_tensor(images["pixel_values"]))
                grids.append(grid)
            start = end
        if start < rope.shape[2]:  # padding continues the last sequence's positions
            last = int(rope[:, r, start - 1].max()) + 1 if start else 0
            rope[:, r, start:] = torch.arange(last, last + rope.shape[2] - start)
    return {
        "mrope_position_ids": torch.cat([positions.unsqueeze(0), rope]),
        "pixel_values": torch.cat(pixels) if pixels else None,
        "image_grid_thw": torch.cat(grids) if grids else None,
    }


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
