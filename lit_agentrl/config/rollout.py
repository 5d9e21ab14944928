"""The rollout side's settings as typed groups, ``RolloutCallback``'s ``init_args``: frozen, built by keyword and
checked when built, so a bad value fails before any engine starts, naming its YAML key. ``lit-agentrl fit
--trainer.callbacks.help RolloutCallback`` prints each group's keys from these docstrings::

    - class_path: RolloutCallback
      init_args:
        engine: {name: sglang, kwargs: {dtype: bfloat16, mem_fraction_static: 0.85}, colocate: true}
        train: {n_samples: 16, sampling_params: {max_new_tokens: 1024, temperature: 1.0}}
        validation: {n_samples: 4, sampling_params: {max_new_tokens: 1024, temperature: 0.6}, pass_k: [1, 4]}
        reward: math
        health: {trajectory_timeout_s: 600}
        async_rollouts: {ahead: 1}

``RolloutSettings`` holds them all and checks them against each other. The sampling parameters are parsed once, here,
into :class:`~lit_agentrl.config.sampling.SamplingParams`, which travel typed to the engines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.errors import UserInputError

DEFAULT_TRAJECTORY_TIMEOUT_S = 1800.0
"""A trajectory's time limit unless ``health.trajectory_timeout_s`` is set: one hung agent or tool must not hold a step
forever (null, no limit, only on purpose)."""

_WHERE = "RolloutCallback"
TOKENIZERLESS_ENGINES = ("sglang", "sglang_http", "sglang_router")
"""Engines that run SGLang without a tokenizer (token in, token out): no stop strings."""


@dataclass(frozen=True)
class EngineSettings:
    """The rollout engines of each rank, and how they share the GPU with the trainer (``RolloutCallback.engine``; a
    name alone, ``engine: sglang``, is the same as ``engine: {name: sglang}``).

    Args:
        name: a registered engine: ``transformers`` or ``sglang`` (one engine per rank), ``transformers_process`` (the
            transformers engine in a process of its own), ``sglang_http`` (running SGLang servers shared by all
            ranks; rank 0 pushes the weights), ``sglang_router`` (SGLang servers behind SGLang's router, each
            trajectory's calls on one server), or your own (``@register_engine("name")``).
        kwargs: the engine's constructor arguments (e.g. ``max_running_requests``, ``dtype``, ``mem_fraction_static``;
            ``urls`` for ``sglang_http``, ``router_url`` for ``sglang_router``).
        modules: modules (dotted names or ``.py`` paths) imported at setup, before the engines are built, so the
            ``@register_engine`` of users' engines runs.
        max_inflight: most trajectories in flight against one engine.
        sync_bucket_mb: the size of one weight-push bucket.
        colocate: the engine shares the trainer's GPU: its memory (weights and KV cache) is released outside rollouts
            and resumed around the weight push (needs SGLang's ``enable_memory_saver``); the push then runs before
            each rollout, not after each step (:mod:`lit_agentrl.rollout.colocation`).
        offload_trainer: in colocated mode, move the trainer's parameters and optimizer state (and the reference's)
            to host memory while the engine generates (default: on with ``colocate``; needs ``colocate``).
    """

    name: str = "transformers"
    kwargs: dict[str, Any] = field(default_factory=dict)
    modules: list[str] = field(default_factory=list)
    max_inflight: int = 256
    sync_bucket_mb: int = 512
    colocate: bool = False
    offload_trainer: bool | None = None

    def __post_init__(self) -> None:
        where = "RolloutCallback.engine"
        if not self.name:
            raise UserInputError(f"{where}.name must name a registered engine, got {self.name!r}")
        if self.max_inflight < 1:
            raise UserInputError(f"{where}.max_inflight must be >= 1, got {self.max_inflight}")
        if self.sync_bucket_mb < 1:
            raise UserInputError(f"{where}.sync_bucket_mb must be >= 1, got {self.sync_bucket_mb}")
        if self.offload_trainer and not self.colocate:
            raise UserInputError(
                f"{where}.offload_trainer needs colocate: true (the trainer's states leave the GPU only to make room "
                "for an engine on the same GPU)"
            )

    @property
    def offloads(self) -> bool:
        """Whether the trainer's states go to host memory while the engine generates (``offload_trainer``, whose
        default follows ``colocate``)."""
        return self.colocate if self.offload_trainer is None else self.offload_trainer


@dataclass(frozen=True)
class DynamicSampling:
    """DAPO's dynamic sampling (``RolloutCallback.train.dynamic_sampling``; Yu et al. 2025): groups whose rewards are
    all equal (no gradient) are dropped, and more prompts are drawn, one step's worth per round from a seeded stream of
    their own whose position is checkpointed, until the step has ``data.prompts_per_step`` informative groups or
    ``max_rounds`` extra rounds are spent.

    Args:
        max_rounds: the most extra rounds of one step.
    """

    max_rounds: int = 4

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise UserInputError(f"{_WHERE}.train.dynamic_sampling.max_rounds must be >= 1, got {self.max_rounds}")


@dataclass(frozen=True)
class TrainRollouts:
    """The rollouts trained on (``RolloutCallback.train``).

    Args:
        n_samples: trajectories per prompt (the GRPO group size).
        sampling_params: SGLang's sampling parameters (``max_new_tokens``, ``temperature``, ``top_p``, ...; see
            Configuration). ``temperature`` must be > 0: the trainer computes log-probs at it. ``n`` must be 1.
        dynamic_sampling: DAPO's dynamic sampling (null: off; ``{}``: on with its defaults).
    """

    n_samples: int = 8
    sampling_params: Mapping[str, Any] = field(default_factory=dict)
    dynamic_sampling: DynamicSampling | None = None
    sampling: SamplingParams = field(init=False, repr=False, compare=False)
    """``sampling_params`` parsed and checked (what travels to the engines)."""

    def __post_init__(self) -> None:
        where = f"{_WHERE}.train"
        object.__setattr__(self, "sampling", _sampling(self.sampling_params, where))
        if self.n_samples < 1:
            raise UserInputError(f"{where}.n_samples must be >= 1, got {self.n_samples}")
        self.sampling.check_for_rollouts(f"{where}.sampling_params", f"{where}.n_samples", training=True)


@dataclass(frozen=True)
class ValidationRollouts:
    """The rollouts of validation (``RolloutCallback.validation``).

    Args:
        n_samples: trajectories per prompt.
        sampling_params: SGLang's sampling parameters of validation (``temperature: 0`` is greedy).
        pass_k: the k of ``val/pass@k``, ``maj@k`` and ``mean@k``, logged per ``data_source`` and written as a table
            (``lit_agentrl.rollout.evaluation``); each at most ``n_samples``.
    """

    n_samples: int = 1
    sampling_params: Mapping[str, Any] = field(default_factory=dict)
    pass_k: tuple[int, ...] = (1,)
    sampling: SamplingParams = field(init=False, repr=False, compare=False)
    """``sampling_params`` parsed and checked (what travels to the engines)."""

    def __post_init__(self) -> None:
        where = f"{_WHERE}.validation"
        object.__setattr__(self, "sampling", _sampling(self.sampling_params, where))
        object.__setattr__(self, "pass_k", tuple(self.pass_k))
        if self.n_samples < 1:
            raise UserInputError(f"{where}.n_samples must be >= 1, got {self.n_samples}")
        if not self.pass_k or any(k < 1 for k in self.pass_k):
            raise UserInputError(f"{where}.pass_k must be a non-empty list of k >= 1, got {list(self.pass_k)}")
        if max(self.pass_k) > self.n_samples:
            raise UserInputError(
                f"{where}.pass_k={list(self.pass_k)} needs k <= {where}.n_samples={self.n_samples} (the samples per "
                "validation prompt)",
                hint=f"set {where}.n_samples >= {max(self.pass_k)} or drop the larger k",
            )
        self.sampling.check_for_rollouts(f"{where}.sampling_params", f"{where}.n_samples", training=False)


DEFAULT_JUDGE_RUBRIC = (
    "You grade a response to a task. Judge whether the response is correct and complete (against the reference "
    "answer, when one is given). Reason briefly, then end your reply with one line: SCORE: <a number from 0 to 1>."
)
DEFAULT_RANKING_RUBRIC = (
    "You compare several responses to the same task. Judge how well each one achieves the task (against the reference "
    "answer, when one is given), relative to the others: the best gets the highest score. Reason briefly, then end "
    "your reply with one line per response, in order: SCORE <response number>: <a number from 0 to 1>."
)


@dataclass(frozen=True)
class Judge:
    """An LLM judge (``RolloutCallback.reward.judge``), which the ``judge`` reward asks to score each trajectory.

    Either ``base_url`` (any OpenAI-compatible endpoint, served elsewhere) or ``model_path`` (a judge model served in
    this process by a registered engine, the rollout's ranks each with one).

    Args:
        base_url: the endpoint (``http://host:port/v1``); its key is read from the environment variable
            ``api_key_env`` (unset: ``EMPTY``, what local servers take).
        model: the model name to ask the endpoint for (a local judge: its folder's name).
        api_key_env: the environment variable holding the endpoint's key (never the key itself in a config).
        model_path: a local judge model folder, served by ``engine`` (with ``engine_kwargs``).
        engine: a registered engine name for ``model_path`` (default ``transformers``).
        engine_kwargs: the judge engine's constructor arguments.
        mode: ``score``: each trajectory judged alone; ``rank``: a prompt group's trajectories judged together, each
            scored relative to the others (RULER's idea: GRPO only needs the order within a group), one call per
            group, after the whole group is generated.
        rubric: the judge's instructions (its system message; default: one per mode); the reply must end with
            ``SCORE: <0..1>`` (``score``) or one ``SCORE <k>: <0..1>`` line per response (``rank``).
        max_tokens: the judge reply's length limit.
        timeout_s: a judge call's time limit; past it the trajectory fails, named (never a silent zero).
        max_concurrency: judge calls in flight at once per rank.
    """

    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    model_path: str | None = None
    engine: str = "transformers"
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    mode: Literal["score", "rank"] = "score"
    rubric: str | None = None
    max_tokens: int = 512
    timeout_s: float = 120.0
    max_concurrency: int = 16

    def __post_init__(self) -> None:
        where = "RolloutCallback.reward.judge"
        if (self.base_url is None) == (self.model_path is None):
            raise UserInputError(f"{where}: set exactly one of base_url (an OpenAI-compatible endpoint) and model_path")
        if self.base_url is not None and not self.model:
            raise UserInputError(f"{where}.model: name the model the endpoint {self.base_url} serves")
        if self.timeout_s <= 0 or self.max_tokens < 1 or self.max_concurrency < 1:
            raise UserInputError(f"{where}: timeout_s, max_tokens and max_concurrency must be positive")
        if self.mode not in ("score", "rank"):
            raise UserInputError(f"{where}.mode must be 'score' or 'rank', got {self.mode!r}")

    @property
    def instructions(self) -> str:
        """The rubric, or the mode's default."""
        if self.rubric is not None:
            return self.rubric
        return DEFAULT_JUDGE_RUBRIC if self.mode == "score" else DEFAULT_RANKING_RUBRIC


@dataclass(frozen=True)
class Rewards:
    """How trajectories are scored (``RolloutCallback.reward``; a name alone, ``reward: math``, is ``{fn: math}``).

    A row's reward function is, in order: the agent's own ``reward_score``, the function registered under the row's
    ``data_source``, then ``fn``. At setup, once ``data.agent_modules`` have registered users' functions, an unknown
    name is refused listing the registered ones, and rows that get a function must carry a ground truth.

    Args:
        fn: the default reward function: ``math``, ``next_digit``, ... or your ``@register_reward`` (null: rows
            without a known ``data_source`` or an agent's score get none, and fail); ``judge``: the LLM ``judge``.
        judge: the LLM judge of the ``judge`` reward (required by it, refused without it).
    """

    fn: str | None = None
    judge: Judge | None = None

    def __post_init__(self) -> None:
        if (self.fn == "judge") != (self.judge is not None):
            raise UserInputError(
                "RolloutCallback.reward: fn: judge and reward.judge go together (the judge reward needs its judge; a "
                f"judge with fn={self.fn!r} would never be asked)"
            )


@dataclass(frozen=True)
class Health:
    """What a run does about trajectories that fail or go wrong (``RolloutCallback.health``).

    Args:
        trajectory_timeout_s: a trajectory running longer is cancelled, its engine requests aborted, and marked
            failed (left out of the loss). Default 1800 s; null: no limit, on purpose.
        max_failed_fraction: stop the run when more than this fraction of a step's trajectories (over all ranks)
            failed, quoting the most common reasons, instead of training on what is left.
        flat_reward_warn_steps: warn (naming the likely causes) when every prompt group's rewards have been equal
            for this many steps in a row, as a missing ground truth or the wrong reward function makes them (0: off).
        template_drift: count ``rollout/template_drift``, trajectories whose tokens differ from their conversation
            rendered by the chat template (one render per trajectory; not logged when off).
    """

    trajectory_timeout_s: float | None = DEFAULT_TRAJECTORY_TIMEOUT_S
    max_failed_fraction: float = 0.5
    flat_reward_warn_steps: int = 5
    template_drift: bool = True

    def __post_init__(self) -> None:
        where = f"{_WHERE}.health"
        if self.trajectory_timeout_s is not None and self.trajectory_timeout_s <= 0:
            raise UserInputError(f"{where}.trajectory_timeout_s must be > 0 or null, got {self.trajectory_timeout_s}")
        if not 0.0 <= self.max_failed_fraction <= 1.0:
            raise UserInputError(f"{where}.max_failed_fraction must be in [0, 1], got {self.max_failed_fraction}")
        if self.flat_reward_warn_steps < 0:
            raise UserInputError(f"{where}.flat_reward_warn_steps must be >= 0, got {self.flat_reward_warn_steps}")


@dataclass(frozen=True)
class AsyncRollouts:
    """Rollouts of the coming steps generated while this one trains (``RolloutCallback.async_rollouts``).

    Args:
        ahead: steps generated ahead of the one training (0: none; without ``partial``, at most 1).
        partial: push the weights as soon as a step ends, into requests in flight (they keep the log-probs they were
            sampled with and continue on the new weights); needs engines that take weights while generating.
        ready_fraction: with ``partial``, a step trains once this fraction of its prompt groups have finished; the
            rest keep generating and are trained with the next step. 1.0 (default): every group.
        max_staleness: trajectories whose oldest tokens are more updates older than the policy are dropped and
            counted; default ``staleness``, what the schedule produces (it may not be lower).

    Three knobs that constrain each other, so one value checked together. The staleness a schedule produces follows
    from them: a rollout started ``ahead`` steps early is trained ``ahead`` updates after its first token, and a
    carried group (:mod:`lit_agentrl.rollout.tail`) one update later still; that is the one place it is decided.

    Example: ``async_rollouts: {ahead: 2, partial: true, ready_fraction: 0.8}``.
    """

    ahead: int = 1
    partial: bool = False
    ready_fraction: float = 1.0
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        where = "RolloutCallback.async_rollouts"
        if self.ahead < 0:
            raise UserInputError(f"{where}.ahead must be >= 0, got {self.ahead}")
        if not 0.0 < self.ready_fraction <= 1.0:
            raise UserInputError(f"{where}.ready_fraction must be in (0, 1], got {self.ready_fraction}")
        if not self.partial and self.ahead > 1:
            raise UserInputError(
                f"{where}.ahead={self.ahead} needs partial: true: without it a weight push waits for the rollouts in "
                "flight, so only the next step's can run ahead",
                hint=f"set {where}.partial: true, or ahead: 1",
            )
        if self.ready_fraction < 1.0 and not self.partial:
            raise UserInputError(
                f"{where}.ready_fraction={self.ready_fraction} carries a step's unfinished groups into the next step, "
                "on newer weights: it needs partial: true",
                hint=f"set {where}.partial: true, or ready_fraction: 1.0",
            )
        if self.max_staleness is not None and self.max_staleness < self.staleness:
            raise UserInputError(
                f"{where}.max_staleness={self.max_staleness} is below the staleness this schedule produces "
                f"({self.staleness}: ahead={self.ahead}{', plus one for carried groups' if self.carries else ''}): "
                "it would drop the rollouts it runs ahead",
                hint=f"leave max_staleness unset (it defaults to {self.staleness}), or run fewer steps ahead",
            )

    @property
    def carries(self) -> bool:
        """Whether unfinished groups are carried to the next step."""
        return self.ready_fraction < 1.0

    @property
    def staleness(self) -> int:
        """The most updates a trained trajectory's oldest tokens are behind the policy, under this schedule."""
        return self.ahead + int(self.carries)

    @property
    def dropped_beyond(self) -> int:
        """Trajectories staler than this are dropped (``max_staleness``, default :attr:`staleness`)."""
        return self.staleness if self.max_staleness is None else self.max_staleness


@dataclass(frozen=True)
class RolloutSettings:
    """Every group of ``RolloutCallback``, checked against each other (see each group for its keys)."""

    engine: EngineSettings = field(default_factory=EngineSettings)
    train: TrainRollouts = field(default_factory=TrainRollouts)
    validation: ValidationRollouts = field(default_factory=ValidationRollouts)
    reward: Rewards = field(default_factory=Rewards)
    health: Health = field(default_factory=Health)
    async_rollouts: AsyncRollouts | None = None

    def __post_init__(self) -> None:
        if self.async_rollouts is not None and self.engine.colocate:
            raise UserInputError(
                f"{_WHERE}.async_rollouts generates while the trainer trains, so the engine cannot share the "
                "trainer's GPU memory (engine.colocate: true)",
                hint="give the engine GPUs of its own (sglang_http servers), or drop async_rollouts with colocate",
            )
        if self.async_rollouts is not None and self.train.dynamic_sampling is not None:
            raise UserInputError(
                f"{_WHERE}.async_rollouts does not combine with train.dynamic_sampling yet (its extra rounds depend on "
                "the step's rollout)",
                hint="set train.dynamic_sampling: null, or drop async_rollouts",
            )
        if self.engine.name in TOKENIZERLESS_ENGINES:
            for group in ("train", "validation"):
                params: SamplingParams = getattr(self, group).sampling
                params.check_without_tokenizer(self.engine.name, f"{_WHERE}.{group}.sampling_params")


def _sampling(params: Mapping[str, Any], where: str) -> SamplingParams:
    return SamplingParams.of(params, where=f"{where}.sampling_params")
