"""Sampling in SGLang's vocabulary: the parameters, validated once before any request is queued, and the
transformers engine's sampler, which penalises and truncates as SGLang's sampler does.

Semantics follow SGLang 0.5.23 (paths and lines below are under ``sglang/srt/`` in that release):

- Defaults and ranges: ``sampling/sampling_params.py`` 149-181 and ``verify`` 252-279.
- Penalties count the request's own generated tokens only, never its prompt: the penalisers are fed each newly
  sampled token (``penaltylib/frequency_penalty.py`` 39-47, ``presence_penalty.py`` 39-47,
  ``repetition_penalty.py`` 52-60, fed by ``managers/schedule_batch.py`` 3715-3735). They act on the raw logits,
  before temperature scaling and top-k/top-p/min-p (``model_executor/model_runner.py`` 2075-2093 penalises before
  ``layers/sampler.py`` 275 divides by the temperature): first the additive ones, ``logit - frequency_penalty *
  count - presence_penalty * [count > 0]``, then the repetition penalty on the result, which multiplies a negative
  logit of a token generated before and divides any other (``sampling/sampling_batch_info.py`` 426-437,
  ``penaltylib/repetition_penalty.py`` 10-16).
- Returned logprobs are taken after the penalties: SGLang's sampler computes them from the logits it is handed,
  already penalised (``layers/sampler.py`` 219-223 greedy, 306-316 sampled). They are therefore not what the
  trainer recomputes from the policy whenever a penalty is on.
- ``stop`` strings are matched on the decoded tail of the output (:meth:`SamplingParams.stop_window`); they need a
  tokenizer, and SGLang refuses them under ``skip_tokenizer_init`` (``sampling/sampling_params.py`` 440-457, called
  for every request at ``managers/tokenizer_manager.py`` 1566).

SGLang itself departs from the penalty semantics above in two ways, measured on the tiny model (see
``tests/engines/test_sglang_penalties.py``): its default overlap scheduler counts one token late (a decode step is
prepared before the previous step's token reaches the request, ``managers/scheduler.py`` 2084 and 2120, so the
prompt's last token is counted from the second output token on and the token just generated is not), and without
overlap it applies the penalties in the order of a set of classes (``sampling/sampling_batch_info.py`` 276-285,
``penaltylib/orchestrator.py`` 67-69), frequency, repetition, presence in our runs. Both are left out here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from lit_agentrl.errors import UserInputError

log = logging.getLogger(__name__)

MAX_STOP_COUNT = 32  # SGLang's limit on stop strings (sampling/sampling_params.py 44, checked at 339)
_said: set[tuple[str, str]] = set()  # (caller, key) of the per-call overrides already warned about


@dataclass(frozen=True)
class SamplingParams(Mapping[str, Any]):
    """The subset of SGLang's ``sampling_params`` that a token-in/token-out rollout uses.

    Keys, defaults and valid ranges follow SGLang (``SamplingParams.verify``), so the same dict drives both
    engines: ``frequency_penalty`` and ``presence_penalty`` in [-2, 2] (0: off), ``repetition_penalty`` in
    (0, 2] (1: off), ``stop``: a string or a list of at most 32 strings, which ends generation when the decoded
    output contains one (needs the model's tokenizer; SGLang engines run with ``skip_tokenizer_init`` and so
    cannot honour it, see ``check_without_tokenizer``).

    Parsed once, from the YAML (:meth:`of`), it travels typed from the rollout to the engines; only an engine's
    adapter writes SGLang's dict (:meth:`to_request`). It also reads as that dict (a ``Mapping``), for agents
    written against SGLang's ``sampling_params`` (``params["max_new_tokens"]``, ``dict(params)``).
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    n: int = 1
    sampling_seed: int | None = None

    @classmethod
    def of(cls, params: Mapping[str, Any] | None, *, where: str = "sampling_params") -> SamplingParams:
        """``params`` as :class:`SamplingParams`: itself when it is one, else parsed from SGLang's dict (the one place a
        dict becomes parameters), raising ``ValueError`` that names the bad key and the valid range."""
        return params if isinstance(params, SamplingParams) else cls._from_dict(params, where)

    @classmethod
    def _from_dict(cls, params: Mapping[str, Any] | None, where: str) -> SamplingParams:
        params = dict(params or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise UserInputError(f"{where}: unknown key(s) {unknown}; valid keys are {sorted(known)}")
        if "stop_token_ids" in params:
            params["stop_token_ids"] = tuple(int(t) for t in (params["stop_token_ids"] or ()))
        if "stop" in params:
            params["stop"] = _stop_strings(params["stop"], where)
        for key in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
            if key in params and params[key] is None:  # SGLang reads None as the default
                del params[key]
        sp = cls(**params)
        sp._check(where)
        return sp

    def __getitem__(self, key: str) -> Any:
        return self.to_request()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_request())

    def __len__(self) -> int:
        return len(self.to_request())

    def __bool__(self) -> bool:  # a whole parameter set, even all defaults (whose dict is empty)
        return True

    def for_call(self, call: Mapping[str, Any] | None, caller: str) -> SamplingParams:
        """The parameters of one model call of a rollout whose parameters these are, the one policy of ``ChatModel``
        and the OpenAI gateway: a call may lower ``max_new_tokens`` and add ``stop`` strings or ``stop_token_ids``;
        any other value it sets that differs from the rollout's is not used, and a warning names it (once per
        ``caller`` and key), since the trainer computes each token's log-prob at the rollout's temperature and
        filters."""
        if call is None or call is self:
            return self
        parsed = SamplingParams.of(call, where=f"{caller}: sampling_params")
        keys = parsed.to_request() if isinstance(call, SamplingParams) else call
        changes: dict[str, Any] = {}
        for key in keys:
            asked, run = getattr(parsed, key), getattr(self, key)
            if asked == run:
                continue
            if key == "max_new_tokens" and asked < run:
                changes[key] = asked
            elif key in ("stop", "stop_token_ids"):
                changes[key] = tuple(dict.fromkeys((*run, *asked)))
            elif (caller, key) not in _said:
                _said.add((caller, key))
                log.warning(
                    "%s asked for %s=%r; the rollout's %s=%r is used (a call may only lower max_new_tokens and add "
                    "stop strings or stop_token_ids: the trainer's log-probs assume the rollout's sampling). Said once.",
                    caller, key, asked, key, run,
                )  # fmt: skip
        return replace(self, **changes) if changes else self

    def to_request(self) -> dict[str, Any]:
        """The ``sampling_params`` dict of a request: the keys whose values differ from SGLang's defaults (lists for
        the tuples), so an engine or an agent reads exactly what was configured."""
        default = SamplingParams()
        return {
            f.name: list(value) if isinstance(value, tuple) else value
            for f in fields(self)
            if (value := getattr(self, f.name)) != getattr(default, f.name)
        }

    def _check(self, where: str) -> None:
        checks = [
            (self.max_new_tokens >= 0, "max_new_tokens must be >= 0"),
            (self.temperature >= 0.0, "temperature must be >= 0 (0 means greedy)"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k must be -1 (off) or >= 1"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be in [-2, 2] (0 = off)"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2] (0 = off)"),
            (0.0 < self.repetition_penalty <= 2.0, "repetition_penalty must be in (0, 2] (1 = off)"),
            (self.n >= 1, "n must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserInputError(f"{where}: {message}; got {self}")

    def check_for_rollouts(self, where: str, group_key: str, *, training: bool) -> None:
        """Refuse what rollouts cannot use: ``n > 1`` (an agent's model call is one turn of one trajectory, and a
        group of trajectories per prompt is ``group_key``) and, for training, temperature 0 (the trainer computes
        log-probs at the sampling temperature, dividing the logits by it; greedy is for validation)."""
        if self.n != 1:
            raise UserInputError(
                f"{where}.n={self.n}: each model call of an agent samples one reply; set {group_key} for several "
                "trajectories per prompt"
            )
        if training and self.temperature == 0:
            raise UserInputError(
                f"{where}.temperature=0: training samples at a temperature > 0 (the trainer computes the log-probs "
                "of softmax(logits / temperature)); greedy decoding (0) is for val_sampling_params"
            )

    @property
    def penalised(self) -> bool:
        """Whether any of the three penalties is on (SGLang's penalisers' ``_is_required``)."""
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    def stop_window(self, tokenizer: Any) -> int:
        """How many trailing output tokens are decoded to look for the stop strings: SGLang's
        ``stop_str_max_len + 1``, the longest stop string's length in tokens plus one
        (``sampling/sampling_params.py`` 345-352, ``managers/schedule_batch.py`` 1807-1830).
        """
        return 1 + max((len(tokenizer.encode(s, add_special_tokens=False)) for s in self.stop), default=0)

    def check_without_tokenizer(self, engine: str, where: str = "sampling_params") -> None:
        """Refuse what an engine without a tokenizer cannot honour: ``stop`` strings.

        SGLang engines run with ``skip_tokenizer_init=True``; SGLang 0.5.23 then has no tokenizer
        (``managers/tokenizer_manager.py`` 639-640) and refuses ``stop`` on every request
        (``sampling/sampling_params.py`` 453-457), so such an engine calls this before any request is sent.
        """
        if self.stop:
            raise UserInputError(
                f"{where}.stop={list(self.stop)!r}: engine {engine!r} runs SGLang with skip_tokenizer_init=True, "
                "where SGLang has no tokenizer to decode the output and refuses stop strings; use stop_token_ids, "
                "or the transformers engine"
            )


def _stop_strings(stop: Any, where: str) -> tuple[str, ...]:
    """SGLang's ``stop``: None, a string or a list of strings (at most :data:`MAX_STOP_COUNT`), as a tuple."""
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, Sequence) else None
    if strings is None or not all(isinstance(s, str) for s in strings):
        raise UserInputError(f"{where}: stop must be a string or a list of strings; got {stop!r}")
    if len(strings) > MAX_STOP_COUNT:
        raise UserInputError(
            f"{where}: stop takes at most {MAX_STOP_COUNT} strings (SGLang's limit); got {len(strings)}"
        )
    return strings


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams], counts: torch.Tensor) -> torch.Tensor:
    """SGLang's frequency, presence and repetition penalties, per row; returns the penalised logits.

    logits: [B, V] raw (not temperature-scaled); counts: [B, V], how often each row has generated each token
    (its prompt not counted). Additive penalties first, then the repetition penalty on their result, as
    ``sampling/sampling_batch_info.py`` 426-433 adds ``acc_additive_penalties`` and then applies
    ``acc_scaling_penalties`` (SGLang's default, overlap-scheduled path).
    """
    device = logits.device
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device).unsqueeze(-1)
    presence = torch.tensor([p.presence_penalty for p in params], device=device).unsqueeze(-1)
    repetition = torch.tensor([p.repetition_penalty for p in params], device=device).unsqueeze(-1)
    seen = counts > 0
    # penaltylib/frequency_penalty.py 39-47 and presence_penalty.py 39-47: ``logits.sub_(cumulated)``, cumulated =
    # the penalty per occurrence (scatter_add_) and the penalty once per token seen (scatter_).
    penalised = logits - frequency * counts - presence * seen
    # penaltylib/repetition_penalty.py 10-16 and 52-56: seen tokens get the penalty, others 1;
    # ``where(logits < 0, logits * scale, logits / scale)`` (a zero logit is divided, and stays zero).
    scale = torch.where(seen, repetition, torch.ones_like(repetition))
    return torch.where(penalised < 0, penalised * scale, penalised / scale)


def sample_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    uniforms: torch.Tensor,
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row with per-row penalties/temperature/top-k/top-p/min-p; returns (tokens, logprobs).

    logits: [B, V] float32; uniforms: [B] in [0, 1), one draw from each row's own stream (inverse-CDF
    sampling), so a row's tokens do not depend on which other rows share its batch. counts: [B, V] generated
    token counts per row, needed when a row has a penalty (:func:`apply_penalties`; None: no row has one).
    The logprob is that of the sampled token under softmax(penalised logits / T) (greedy rows: T = 1), i.e.
    after the penalties and before truncation, as SGLang returns it; without penalties that is what the trainer
    recomputes.
    """
    if counts is not None:
        logits = apply_penalties(logits, params, counts)
    elif any(p.penalised for p in params):
        raise ValueError("sample_tokens: a row has a penalty but no generated-token counts were given")
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    filtered = _truncate(scaled, params)
    probs = torch.softmax(filtered, dim=-1)
    cdf = probs.cumsum(dim=-1)
    sampled = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1)).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logprobs_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _truncate(scaled: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Mask logits outside each row's top-k / top-p / min-p set with -inf.

    SGLang's rules (``top_k_top_p_min_p_sampling_from_probs_torch``), all three judged on the one full
    distribution: top-k keeps exactly k tokens by rank, top-p keeps a token while the mass ranked above it is
    at most top_p, min-p compares with the most likely token. transformers' ``TopK/TopP/MinPLogitsWarper`` do
    not give the same sets, so they are not used here: top-k keeps every token tied with the k-th, top-p keeps
    a token only while that mass is below top_p (cumulated from the least likely end, whose float error moves
    the cut), a chain of them judges top-p on the top-k-renormalised distribution, and each takes one scalar,
    so per-row settings would need a chain per distinct setting.
    """
    if all(p.top_k == -1 and p.top_p >= 1.0 and p.min_p <= 0.0 for p in params):
        return scaled
    device = scaled.device
    vocab = scaled.shape[-1]
    top_k = torch.tensor([vocab if p.top_k == -1 else min(p.top_k, vocab) for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    min_p = torch.tensor([p.min_p for p in params], device=device)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    drop = ranks >= top_k.unsqueeze(-1)
    drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_p.unsqueeze(-1)
    drop |= sorted_probs < min_p.unsqueeze(-1) * sorted_probs[:, :1]
    drop[:, 0] = False  # the most likely token always survives
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
