"""The update's settings as typed groups, the ``model.*`` keys of a config (``GRPOModule``'s arguments).

Each group is a frozen dataclass whose docstring documents its keys (``lit-agentrl fit --help`` prints them), built by
keyword and checked when built, so a bad value fails before any weight loads, naming its key::

    model:
      model_path: .cache/quickstart-model
      optimizer: {lr: 5.0e-4, grad_clip: 1.0}
      loss: {entropy_coef: 0.01, old_logprobs: trainer}
      correction: {kind: tis}
      compute: {micro_batch_tokens: 16384, param_dtype: bfloat16}
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from lit_agentrl.config import choices
from lit_agentrl.config.choices import (
    ADVANTAGE_STDS,
    CORRECTIONS,
    LEVELS,
    MIS_WEIGHTS,
    SEQUENCE_REWARDS,
    STEP_GROUPS,
)
from lit_agentrl.errors import UserInputError

LR_SCHEDULES = ("constant", "cosine")
OLD_LOGPROBS = ("engine", "trainer")
POLICY_RATIOS = ("token", "sequence")
TRUNCATED = ("keep", "mask", "penalty")
PARAM_DTYPES = ("float32", "bfloat16")


def _check(checks: Iterable[tuple[bool, str]]) -> None:
    for ok, message in checks:
        if not ok:
            raise UserInputError(message)


def _one_of(key: str, value: object, valid: tuple[str, ...]) -> tuple[bool, str]:
    return value in valid, f"{key} must be one of {list(valid)}, got {value!r}"


@dataclass(frozen=True)
class Optimizer:
    """AdamW, its schedule and its steps (``model.optimizer``).

    Args:
        lr: AdamW's learning rate.
        weight_decay: AdamW's weight decay.
        betas: AdamW's betas.
        warmup_steps: linear warm-up, in optimizer steps.
        lr_schedule: ``constant`` or ``cosine`` (to 10% of ``lr`` at the last step) after the warm-up.
        grad_clip: the largest gradient norm (None: no clipping; the norm is still logged). A step whose norm is not
            finite is skipped and counted (``train/skipped_steps``).
        mini_batches: optimizer steps per rollout batch, its samples split evenly; importance ratios are taken
            against the old log-probs (``model.loss.old_logprobs``).
    """

    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    grad_clip: float | None = 1.0
    mini_batches: int = 1

    def __post_init__(self) -> None:
        _check(
            [
                (self.lr > 0, f"model.optimizer.lr must be > 0, got {self.lr}"),
                (self.warmup_steps >= 0, f"model.optimizer.warmup_steps must be >= 0, got {self.warmup_steps}"),
                _one_of("model.optimizer.lr_schedule", self.lr_schedule, LR_SCHEDULES),
                (
                    self.grad_clip is None or self.grad_clip > 0,
                    f"model.optimizer.grad_clip must be > 0 or null, got {self.grad_clip}",
                ),
                (self.mini_batches >= 1, f"model.optimizer.mini_batches must be >= 1, got {self.mini_batches}"),
            ]
        )


@dataclass(frozen=True)
class Loss:
    """The GRPO loss (``model.loss``); the configuration page's table gives each formula and its source.

    Args:
        clip_ratio_low: PPO's clip below (ratio >= 1 - low).
        clip_ratio_high: PPO's clip above (ratio <= 1 + high); above ``clip_ratio_low`` is DAPO's clip-higher.
        clip_ratio_c: dual-clip's c (> 1): a token with a negative advantage A loses at most -c A; None: off.
        kl_coef: weight of the k3 KL to a frozen copy of the initial policy (0: none, and no copy is made).
        entropy_coef: weight of an entropy bonus (0: the entropy is logged only).
        aggregation: how token losses become the loss: ``token-mean``, ``seq-mean-token-mean``,
            ``seq-mean-token-sum``, Dr. GRPO's ``seq-mean-token-sum-norm`` (with ``norm_length``), or any name in
            ``lit_agentrl.training.losses.AGGREGATIONS``.
        norm_length: Dr. GRPO's constant per-sequence normaliser, needed by ``seq-mean-token-sum-norm``.
        policy_ratio: ``token`` (PPO/GRPO) or ``sequence`` (GSPO: one ratio per sequence, the geometric mean of its
            tokens', which needs ``aggregation: seq-mean-token-mean``, GSPO's mean over sequences).
        advantage_std: what a group's centred rewards are divided by: ``sample`` (the unbiased n - 1 std, as TRL,
            verl and OpenRLHF do), ``population`` (the n std, as ChatLearn does) or ``none`` (Dr. GRPO).
        advantage: the estimator, per model turn (the configuration page gives each formula): ``grpo`` (every turn
            its trajectory's group-normalised reward), ``gigpo`` (GiGPO: plus ``step_weight`` times a step
            advantage among the group's turns generated from the same context), ``turn_returns`` (each turn's
            discounted reward-to-go, baselined per turn index) or ``gae`` (GAE over turns with a learned critic).
        gamma: the discount per turn of ``gigpo``, ``turn_returns`` and ``gae``; unset, each one's own (``gigpo`` the
            paper's 0.95, the others 1.0: :data:`~lit_agentrl.config.choices.DEFAULT_GAMMAS`).
        step_weight: GiGPO's omega, the weight of its step advantage; unset, the paper's 1.0.
        gae_lambda: GAE's lambda for ``gae`` (unset: 0.95, the PPO paper's); 1 uses the critic as a baseline only,
            lower values bootstrap from it.
        value_lr: the learning rate of ``gae``'s critic, a small value head on the policy's detached final hidden
            states with an AdamW of its own (unset: 1e-3).
        step_groups: where ``gigpo`` finds a turn's step partners: ``group`` (its prompt group, the paper's) or
            ``batch`` (any trajectory of the step's rollout batch, gathered from every data-parallel rank: for rows
            that share a prompt and differ only in what the environment hides).
        step_first_turn: whether ``gigpo``'s step advantage also credits first turns (unset: true, the paper's).
            Their step group is the prompt's, which the episode advantage compares already; false leaves first turns
            the episode advantage alone (a single-turn task then gets exactly ``grpo``).
        sequence_rewards: how a trajectory whose model calls formed several token sequences is scored: ``shared``
            (each sequence gets the trajectory's advantage) or ``own`` (each sequence is a member of its group,
            scored by the reward the agent gave it, else the trajectory's).
        old_logprobs: the PPO ratio's denominator: ``engine`` (the rollout's own log-probs) or ``trainer`` (the
            policy's before the update, with the same micro-batches and packing).
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float | None = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aggregation: str = "token-mean"
    norm_length: int | None = None
    policy_ratio: Literal["token", "sequence"] = "token"
    advantage_std: Literal["sample", "population", "none"] = "sample"
    advantage: str = "grpo"
    gamma: float | None = None
    step_weight: float | None = None
    step_groups: Literal["group", "batch"] = "group"
    step_first_turn: bool | None = None
    gae_lambda: float | None = None
    value_lr: float | None = None
    sequence_rewards: Literal["shared", "own"] = "shared"
    old_logprobs: Literal["engine", "trainer"] = "engine"

    def __post_init__(self) -> None:
        _check(
            [
                (
                    0 <= self.clip_ratio_low < 1,
                    f"model.loss.clip_ratio_low must be in [0, 1), got {self.clip_ratio_low}",
                ),
                (self.clip_ratio_high >= 0, f"model.loss.clip_ratio_high must be >= 0, got {self.clip_ratio_high}"),
                (
                    self.clip_ratio_c is None or self.clip_ratio_c > 1,
                    f"model.loss.clip_ratio_c (dual-clip) must be > 1 or null, got {self.clip_ratio_c}",
                ),
                (self.kl_coef >= 0, f"model.loss.kl_coef must be >= 0, got {self.kl_coef}"),
                (self.entropy_coef >= 0, f"model.loss.entropy_coef must be >= 0, got {self.entropy_coef}"),
                _one_of("model.loss.aggregation", self.aggregation, choices.AGGREGATIONS),  # read late: extendable
                (
                    self.aggregation != "seq-mean-token-sum-norm" or (self.norm_length or 0) > 0,
                    "model.loss.aggregation seq-mean-token-sum-norm divides by a constant length: set "
                    f"model.loss.norm_length (e.g. the max_new_tokens of sampling), got {self.norm_length}",
                ),
                _one_of("model.loss.policy_ratio", self.policy_ratio, POLICY_RATIOS),
                (
                    self.policy_ratio != "sequence" or self.aggregation == "seq-mean-token-mean",
                    "model.loss.policy_ratio: sequence is GSPO, whose objective is a mean over sequences: set "
                    f"model.loss.aggregation: seq-mean-token-mean (got {self.aggregation!r}, which weighs a sequence "
                    "by its length)",
                ),
                _one_of("model.loss.advantage_std", self.advantage_std, ADVANTAGE_STDS),
                _one_of("model.loss.advantage", self.advantage, choices.ADVANTAGES),
                (0.0 <= self.discount <= 1.0, f"model.loss.gamma must be in [0, 1], got {self.gamma}"),
                (self.omega >= 0, f"model.loss.step_weight must be >= 0, got {self.step_weight}"),
                (
                    self.gamma is None or self.advantage != "grpo",
                    f"model.loss.gamma: {self.gamma} discounts the turn returns of gigpo, turn_returns and gae, and "
                    "model.loss.advantage is grpo, which credits every turn with the undiscounted trajectory reward: "
                    "set advantage: gigpo, turn_returns or gae, or drop gamma",
                ),
                (
                    self.step_weight is None or self.advantage == "gigpo",
                    f"model.loss.step_weight: {self.step_weight} weighs gigpo's step advantage, and "
                    f"model.loss.advantage is {self.advantage}: set advantage: gigpo, or drop step_weight",
                ),
                (0.0 <= self.lam <= 1.0, f"model.loss.gae_lambda must be in [0, 1], got {self.gae_lambda}"),
                (self.critic_lr > 0, f"model.loss.value_lr must be > 0, got {self.value_lr}"),
                *(
                    (
                        value is None or self.advantage == "gae",
                        f"model.loss.{key}: {value} belongs to gae's critic, and model.loss.advantage is "
                        f"{self.advantage}: set advantage: gae, or drop {key}",
                    )
                    for key, value in (("gae_lambda", self.gae_lambda), ("value_lr", self.value_lr))
                ),
                _one_of("model.loss.step_groups", self.step_groups, STEP_GROUPS),
                (
                    self.step_groups == "group" or self.advantage == "gigpo",
                    f"model.loss.step_groups: {self.step_groups} says where gigpo's step groups are formed, and "
                    f"model.loss.advantage is {self.advantage}: set advantage: gigpo, or drop step_groups",
                ),
                (
                    self.step_first_turn is None or self.advantage == "gigpo",
                    f"model.loss.step_first_turn: {self.step_first_turn} says whether gigpo's step advantage credits "
                    f"first turns, and model.loss.advantage is {self.advantage}: set advantage: gigpo, or drop "
                    "step_first_turn",
                ),
                (
                    self.step_first_turn is None or isinstance(self.step_first_turn, bool),
                    f"model.loss.step_first_turn must be true or false, got {self.step_first_turn!r}",
                ),
                (
                    self.policy_ratio != "sequence" or self.advantage == "grpo",
                    f"model.loss.policy_ratio: sequence (GSPO) clips one ratio per sequence against one advantage; "
                    f"model.loss.advantage: {self.advantage} gives each turn its own: use advantage: grpo with it",
                ),
                (
                    self.sequence_rewards != "own" or self.advantage == "grpo",
                    f"model.loss.sequence_rewards: own scores sequences apart, and model.loss.advantage: "
                    f"{self.advantage} credits the turns of one sequence: use one of them",
                ),
                _one_of("model.loss.sequence_rewards", self.sequence_rewards, SEQUENCE_REWARDS),
                _one_of("model.loss.old_logprobs", self.old_logprobs, OLD_LOGPROBS),
            ]
        )

    @property
    def discount(self) -> float:
        """``gamma`` as the estimator uses it: as set, else the estimator's own (``DEFAULT_GAMMAS``, else 1.0)."""
        return self.gamma if self.gamma is not None else choices.DEFAULT_GAMMAS.get(self.advantage, 1.0)

    @property
    def lam(self) -> float:
        """``gae_lambda`` as ``gae`` uses it: as set, else the PPO paper's 0.95."""
        return self.gae_lambda if self.gae_lambda is not None else 0.95

    @property
    def critic_lr(self) -> float:
        """``value_lr`` as ``gae``'s critic uses it: as set, else 1e-3."""
        return self.value_lr if self.value_lr is not None else 1e-3

    @property
    def omega(self) -> float:
        """``step_weight`` as ``gigpo`` uses it: as set, else the paper's 1.0."""
        return self.step_weight if self.step_weight is not None else 1.0

    @property
    def first_turn_steps(self) -> bool:
        """``step_first_turn`` as ``gigpo`` uses it: as set, else the paper's true."""
        return self.step_first_turn if self.step_first_turn is not None else True

    @property
    def needs_reference(self) -> bool:
        """Whether the loss needs the reference model's log-probs."""
        return self.kl_coef > 0

    @property
    def scale_length(self) -> float:
        """Dr. GRPO's constant length (1 for every other aggregation)."""
        return float(self.norm_length or 1)


@dataclass(frozen=True)
class Correction:
    """Importance weights between the engine that sampled the tokens (mu) and the trainer's policy before the update
    (pi_old), multiplying each token's loss (``model.correction``; ``lit_agentrl.training.correction``). Needs
    ``model.loss.old_logprobs: trainer``.

    Args:
        kind: ``tis`` (truncated IS: min(rho, C)) or ``mis`` (masked IS: min(rho, C) inside [C_low, C], 0 outside).
        level: what rho is: ``token`` (each token's pi_old / mu), ``sequence`` (the product of its tokens', shared by
            them) or ``geometric`` (``mis`` only: sequences kept or dropped by their geometric-mean ratio).
        threshold: C, where ``tis`` truncates and the top of ``mis``'s band.
        threshold_low: C_low, the bottom of ``mis``'s band (None: 1 / C).
        mis_weight: what ``mis`` leaves on the tokens it keeps: ``importance`` (their truncated importance weight, the
            published masked importance sampling) or ``one`` (pure rejection sampling).
    """

    kind: Literal["tis", "mis"] = "tis"
    level: Literal["token", "sequence", "geometric"] = "token"
    threshold: float = 2.0
    threshold_low: float | None = None
    mis_weight: Literal["importance", "one"] = "importance"

    def __post_init__(self) -> None:
        _check(
            [
                _one_of("model.correction.kind", self.kind, CORRECTIONS),
                _one_of("model.correction.level", self.level, LEVELS),
                (
                    self.kind != "tis" or self.level != "geometric",
                    "model.correction.kind: tis weighs tokens by an importance weight, and a geometric-mean ratio is "
                    "not one: set model.correction.level to sequence (the product of the token ratios) or token, or "
                    "model.correction.kind: mis to drop sequences by their geometric mean",
                ),
                (self.threshold > 0, f"model.correction.threshold must be > 0, got {self.threshold}"),
                (
                    self.threshold_low is None or 0 <= self.threshold_low < self.threshold,
                    f"model.correction.threshold_low must be in [0, threshold), got {self.threshold_low}",
                ),
                _one_of("model.correction.mis_weight", self.mis_weight, MIS_WEIGHTS),
            ]
        )


@dataclass(frozen=True)
class Overlong:
    """What trajectories cut by the length limit get (``model.overlong``; DAPO's two options).

    Args:
        mode: ``keep`` (trained like finished ones), ``mask`` (they count in their group's advantages but carry no
            loss) or ``penalty`` (DAPO's soft overlong punishment, added to every trajectory's reward).
        max_length: L_max, the generated-token budget the penalty compares against: the model's tokens summed over
            all of a trajectory's turns (in a multi-turn run, the trajectory's whole budget, not one turn's).
        buffer: L_cache: the penalty is 0 up to ``max_length - buffer`` tokens, then falls linearly to
            ``-penalty_factor`` at ``max_length`` (and stays there beyond).
        penalty_factor: the penalty at ``max_length``, negated.
    """

    mode: Literal["keep", "mask", "penalty"] = "keep"
    max_length: int | None = None
    buffer: int = 0
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        _check(
            [
                _one_of("model.overlong.mode", self.mode, TRUNCATED),
                (
                    self.mode != "penalty" or bool(self.max_length and 0 < self.buffer <= self.max_length),
                    "model.overlong.mode: penalty needs model.overlong.max_length (the generated-token budget, e.g. "
                    "max_new_tokens) and 0 < model.overlong.buffer <= it, got "
                    f"{self.max_length} and {self.buffer}",
                ),
            ]
        )

    def penalty(self, generated: int) -> float:
        """DAPO's R_length for ``generated`` tokens (0 unless ``mode`` is ``penalty``)."""
        if self.mode != "penalty":
            return 0.0
        assert self.max_length is not None
        start = self.max_length - self.buffer
        return -self.penalty_factor * min(max(generated - start, 0) / self.buffer, 1.0)


@dataclass(frozen=True)
class Compute:
    """How the update is computed: memory against time (``model.compute``).

    Args:
        micro_batch_tokens: the token budget of one forward/backward (rows x padded length).
        sequence_packing: pack several sequences into each row (position ids restart per sequence), so training pays
            for almost no padding; checked against unpacked forwards when the model loads.
        logprob_chunk_tokens: the output head runs on the trained tokens only, this many at a time, its logits
            recomputed in backward (``lit_agentrl.training.logprobs``); 0 computes full logits at every position, as the
            model's own forward does (more memory, no recomputation).
        gradient_checkpointing: recompute activations in backward to save memory.
        param_dtype: ``float32``, or ``bfloat16`` for FSDP2's mixed precision (fp32 master weights and reductions;
            needs ``trainer.strategy: ModelParallelStrategy``).
    """

    micro_batch_tokens: int = 16384
    sequence_packing: bool = True
    logprob_chunk_tokens: int = 1024
    gradient_checkpointing: bool = False
    param_dtype: Literal["float32", "bfloat16"] = "float32"

    def __post_init__(self) -> None:
        _check(
            [
                (
                    self.micro_batch_tokens >= 1,
                    f"model.compute.micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}",
                ),
                (
                    self.logprob_chunk_tokens >= 0,
                    "model.compute.logprob_chunk_tokens must be >= 0 (0: full logits), got "
                    f"{self.logprob_chunk_tokens}",
                ),
                _one_of("model.compute.param_dtype", self.param_dtype, PARAM_DTYPES),
            ]
        )


LORA_SYNCS = ("merged", "adapter")
QWEN_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Qwen-style decoder block: LoRA's usual targets (``all-linear`` without the head)."""


@dataclass(frozen=True)
class Lora:
    r"""Low-rank adapters on a frozen base (``model.lora``; through peft): off unless ``rank`` is set.

    Args:
        rank: the adapters' rank r (None: full fine-tuning).
        alpha: the scale's numerator, each adapter's output scaled by alpha / r (None: 2 r, as most recipes do).
        dropout: dropout on the adapters' input. Keep 0 for RL: dropout in the trainer's forward changes the
            log-probs the ratio compares with the engine's.
        target_modules: the linear layers that get adapters, spelled as peft spells them: a list of names, each
            matching a module whose full name is it or ends with ``.`` and it (``q_proj``, ``self_attn.q_proj``);
            ``all-linear``, every linear layer but the head; or one other string, a regular expression that must
            match a module's full name whole (``.*layers\.[0-3]\..*_proj``). Default: every linear layer of a
            Qwen-style block. Each list entry must match a module, and every module selected must be a linear
            layer other than the head: checked against the model before the first step.
        base_dtype: the dtype the frozen base is kept in (no fp32 master copy, no optimizer state); the adapters are
            trained in float32.
        sync: what the engines get after each step: ``merged`` (the base with the adapters folded in, every
            weight, as a full push; any engine) or ``adapter`` (the adapters' tensors only, for engines that serve
            LoRA adapters: the transformers engine, and SGLang, which the trainer starts to serve them; refused with a
            colocated SGLang, which frees its base in every window).
    """

    rank: int | None = None
    alpha: int | None = None
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = QWEN_LINEAR_MODULES
    base_dtype: Literal["float32", "bfloat16"] = "bfloat16"
    sync: Literal["merged", "adapter"] = "merged"

    def __post_init__(self) -> None:
        _check(
            [
                (self.rank is None or self.rank >= 1, f"model.lora.rank must be >= 1 or null, got {self.rank}"),
                (self.alpha is None or self.alpha > 0, f"model.lora.alpha must be > 0 or null, got {self.alpha}"),
                (0 <= self.dropout < 1, f"model.lora.dropout must be in [0, 1), got {self.dropout}"),
                _one_of("model.lora.base_dtype", self.base_dtype, PARAM_DTYPES),
                _one_of("model.lora.sync", self.sync, LORA_SYNCS),
            ]
        )
        _check_target_modules(self.target_modules, self.sync)

    @property
    def enabled(self) -> bool:
        return self.rank is not None

    @property
    def syncs_adapter(self) -> bool:
        """Whether the engines get the adapters alone (LoRA on, ``sync: adapter``)."""
        return self.enabled and self.sync == "adapter"

    @property
    def scale_alpha(self) -> int:
        """alpha, defaulting to 2 r."""
        return self.alpha if self.alpha is not None else 2 * (self.rank or 0)


LORA_REFUSED_MODULES = ("lm_head", "embed_tokens")
ALL_LINEAR = "all-linear"
"""peft's name for every linear layer but the head (compared case-insensitively, as peft does)."""
HEAD_REFUSAL = (
    "the head and the embeddings take no adapters (a tied head shares its weight with the embeddings, and log-probs "
    "are computed from the head's weight in chunks); adapt the decoder layers' linears, e.g. "
    f"{list(QWEN_LINEAR_MODULES)} or {ALL_LINEAR!r}"
)


def is_all_linear(target_modules: str | tuple[str, ...]) -> bool:
    return isinstance(target_modules, str) and target_modules.lower() == ALL_LINEAR


def _check_target_modules(targets: str | tuple[str, ...], sync: str) -> None:
    """What ``model.lora.target_modules`` can be told wrong without the model: empty, a bad pattern, the head or the
    embeddings by name (their full path too), and a pattern where the engines need names (``sync: adapter``)."""
    key = "model.lora.target_modules"
    if not targets or not all(isinstance(t, str) and t for t in ([targets] if isinstance(targets, str) else targets)):
        raise UserInputError(f"{key} must name at least one module (or be a pattern), got {targets!r}")
    if isinstance(targets, str):
        if not is_all_linear(targets):
            try:
                re.compile(targets)
            except re.error as exc:
                raise UserInputError(f"{key}={targets!r} is not a regular expression ({exc})") from None
        if sync == "adapter":
            raise UserInputError(
                f"{key}={targets!r}: model.lora.sync: adapter starts the engines for module names, which a pattern "
                "does not give",
                hint=f"list the names, e.g. {list(QWEN_LINEAR_MODULES)} (all-linear on a Qwen-style model)",
            )
        return
    refused = [t for t in targets if t.rsplit(".", 1)[-1] in LORA_REFUSED_MODULES]
    if refused:
        raise UserInputError(f"{key}={list(targets)} names the head or the embeddings ({refused}): {HEAD_REFUSAL}")
    dotted = [t for t in targets if "." in t]
    if sync == "adapter" and dotted:
        raise UserInputError(
            f"{key}={list(targets)}: model.lora.sync: adapter starts the engines for module names (SGLang's "
            f"--lora-target-modules), not paths: {dotted}"
        )
