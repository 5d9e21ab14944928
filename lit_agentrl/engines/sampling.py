"""Sampling parameters in SGLang's vocabulary, validated once, before any request is queued."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class SamplingParams:
    """The subset of SGLang's ``sampling_params`` that a token-in/token-out rollout uses.

    Keys and defaults follow SGLang, so the same dict drives both engines. ``stop`` (strings) is not
    supported: engines run with ``skip_tokenizer_init``, so stopping is by token id (``stop_token_ids``).
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    n: int = 1
    sampling_seed: int | None = None

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None, *, where: str = "sampling_params") -> "SamplingParams":
        """Build from a dict, raising ``ValueError`` that names the bad key and the valid range."""
        params = dict(params or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys are {sorted(known)}")
        if "stop_token_ids" in params:
            params["stop_token_ids"] = tuple(int(t) for t in (params["stop_token_ids"] or ()))
        sp = cls(**params)
        sp._check(where)
        return sp

    def _check(self, where: str) -> None:
        checks = [
            (self.max_new_tokens >= 0, "max_new_tokens must be >= 0"),
            (self.temperature >= 0.0, "temperature must be >= 0 (0 means greedy)"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k must be -1 (off) or >= 1"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            (self.n >= 1, "n must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{where}: {message}; got {self}")
