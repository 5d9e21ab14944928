"""Sampling parameters in SGLang's vocabulary, parsed and checked once from the YAML (``RolloutCallback.train`` and
``validation``'s ``sampling_params``) and carried typed to the engines, whose adapters alone write their wire form.

Keys, defaults and ranges follow SGLang 0.5.23 (``sglang/srt/sampling/sampling_params.py`` 149-181, ``verify``
252-279); how the transformers engine samples with them, penalties included, is :mod:`lit_agentrl.engines.sampling`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

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
                "of softmax(logits / temperature)); greedy decoding (0) is for validation.sampling_params"
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
