"""Trajectories and rollout statistics: what the rollout half hands to the trainer."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

AGENT_METRICS_FIELD = "metrics"
"""``extra_fields["metrics"]``: numbers an agent reports per trajectory (name -> float), logged as ``agent/<agent>/<name>``."""


@dataclass
class TokenSequence:
    """A further token-exact sequence of a trajectory, beside its main one: what the model saw and sampled in
    another context (a history the agent rewrote or compacted, a sub-agent's fresh conversation, another choice of
    a call with ``n > 1``). Trained like the main sequence, with the trajectory's advantage unless it has a reward of
    its own and ``model.loss.sequence_rewards`` is ``own``."""

    prompt_ids: list[int]
    """[P] its prompt's token ids."""
    all_token_ids: list[int]
    """[P + R] its prompt then every later token."""
    loss_mask: list[int]
    """[P + R] 1 on generated tokens."""
    response_logprobs: list[float] | None = None
    """[R] engine log-probs of all_token_ids[P:], 0.0 where loss_mask is 0."""
    reward: float | None = None
    """Its own reward, reported by the agent (None: the trajectory's)."""

    @property
    def num_generated_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class Trajectory:
    """One sampled trajectory of one prompt row. Token lists are per trajectory (unpadded).

    ``group`` identifies the prompt: the trajectories of one row share it, and GRPO normalises rewards
    within a group. A failed trajectory keeps its reason and has empty token lists: it never reaches the loss.
    """

    group: int
    """Index of the prompt row in the rollout batch."""
    sample: int
    """Index of this sample among the row's samples."""
    agent_name: str
    prompt_ids: list[int] = field(default_factory=list)
    """[P] prompt token ids."""
    all_token_ids: list[int] = field(default_factory=list)
    """[P + R] prompt then every later token."""
    loss_mask: list[int] = field(default_factory=list)
    """[P + R] 1 on generated tokens."""
    response_logprobs: list[float] | None = None
    """[R] engine log-probs of all_token_ids[P:], 0.0 where loss_mask is 0."""
    reward: float = 0.0
    advantage: float | None = None
    """The advantage the loss used, set when the step prepares its samples (None: failed or not trained); with a
    turn-level ``model.loss.advantage``, its first turn's."""
    turn_rewards: list[float] | None = None
    """Each model turn's own reward, when the agent reported them (``AgentGraphOutput.turn_rewards``); ``reward``
    includes their sum."""
    turn_advantages: list[float] | None = None
    """Each model turn's advantage, with a turn-level ``model.loss.advantage`` (None otherwise)."""
    num_turns: int = 0
    num_model_turns: int = 0
    num_tool_calls: int = 0
    str_output: str = ""
    failed: bool = False
    failure_reason: str | None = None
    failure_traceback: str | None = None
    """The full traceback of a trajectory that raised, ending with where in the agent's file it was raised."""
    seconds: float = 0.0
    weight_versions: tuple[int, int] | None = None
    """The oldest and newest weight version (``RolloutEngine.weight_version``: training steps in the weights) its
    tokens were generated with; they differ for a trajectory continued across a weight update (a partial rollout)."""
    messages: list[dict[str, Any]] | None = None
    """The conversation up to the last model turn as OpenAI-style dicts (``role``, ``content``, ``tool_calls``,
    ``tool_call_id``), when the agent recorded it (``AgentGraph.convert_agent_graph_output`` does)."""
    extra_fields: dict[str, Any] = field(default_factory=dict)
    multi_modal_inputs: dict[str, Any] | None = None
    """A vision-language trajectory's images as the model takes them (``pixel_values`` [N, D], ``image_grid_thw``
    [k, 3]), for the training forward; None for text."""
    other_sequences: list[TokenSequence] = field(default_factory=list)
    """Sequences of this trajectory beside the main one (the token lists above), when its model calls formed
    several contexts; usually none."""

    @property
    def main_sequence(self) -> TokenSequence:
        """The token lists above as a :class:`TokenSequence` (its reward: None, the trajectory's)."""
        return TokenSequence(self.prompt_ids, self.all_token_ids, self.loss_mask, self.response_logprobs)

    @property
    def sequences(self) -> list[TokenSequence]:
        """Every token sequence of the trajectory: the main one, then the others."""
        return [self.main_sequence, *self.other_sequences]

    @property
    def all_rewards(self) -> list[float]:
        """Its reward, then those its other sequences have of their own (``model.loss.sequence_rewards: own``):
        what decides whether its group is flat."""
        return [self.reward, *(s.reward for s in self.other_sequences if s.reward is not None)]

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the model generated (loss_mask == 1), over all its sequences."""
        return sum(self.loss_mask) + sum(s.num_generated_tokens for s in self.other_sequences)

    @property
    def truncated(self) -> bool:
        """Whether the last model turn was cut by the length limit (its finish reason, recorded by
        ``AgentGraph.convert_agent_graph_output``; an agent that records none is never counted as truncated)."""
        finish = self.extra_fields.get("finish_reason")
        return isinstance(finish, dict) and finish.get("type") == "length"


@dataclass
class RolloutStats:
    """Aggregates of one rollout batch (the logged ``rollout/*`` metrics come from :class:`~lit_agentrl.rollout.metrics.RolloutMetrics`)."""

    num_trajectories: int = 0
    num_failed: int = 0
    failure_reasons: Counter = field(default_factory=Counter)
    reward_mean: float = 0.0
    reward_std: float = 0.0
    response_length_mean: float = 0.0
    num_turns_mean: float = 0.0
    tool_calls_mean: float = 0.0
    seconds: float = 0.0
    reward_seconds: float = 0.0
    """Time spent in reward functions: each call's own run time in the rollout manager's reward threads (not its
    wait for a thread), summed over calls; calls overlap, so it can exceed ``seconds``, the rollout's wall time."""
    generated_tokens: int = 0
    template_drift: int = 0
    """Token positions, summed over trajectories, where accumulated ids differ from the re-rendered template."""

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class RolloutBatch:
    """Every trajectory of a rollout (``n`` per row, row-major), their statistics, and the temperature they were
    sampled at (the trainer computes log-probs at it)."""

    trajectories: list[Trajectory]
    stats: RolloutStats
    temperature: float


@dataclass
class PromptBatch:
    """One step's prompt rows for this rank; the rollout callback fills ``rollout`` before ``training_step``."""

    rows: list[dict[str, Any]]
    epoch: int
    index: int
    """Position of this batch within its epoch (global across ranks)."""
    split: str = "train"
    rollout: RolloutBatch | None = None
