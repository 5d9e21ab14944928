"""Validation metrics over ``n`` samples per prompt: ``pass@k``, ``maj@k`` and ``mean@k`` per ``data_source``.

Definitions (a prompt has ``n`` trajectories, ``k <= n``; every figure is a mean over prompts):

- correct: a trajectory that did not fail and has ``reward >= 1.0`` (as ``val/accuracy``).
- ``pass@k``: the unbiased estimator of Chen et al. (2021) of the chance that at least one of ``k`` samples is
  correct, from all ``n`` samples with ``c`` correct: ``1 - C(n - c, k) / C(n, k)``.
- ``maj@k``: majority voting over the prompt's first ``k`` samples (i.i.d., so an unbiased, if not the
  least noisy, estimate): the most common extracted answer wins (ties: the one seen first; failed samples do
  not vote), and the prompt scores 1.0 when the first sample giving that answer is correct. Answers are compared
  as strings after extraction (:func:`extract_answer`), not for mathematical equivalence.
- ``mean@k``: the expected mean reward of ``k`` samples, which is the mean reward of all ``n`` (a failed
  trajectory counts 0); it does not depend on ``k`` and is reported next to the others for reading.

Rows without a ``data_source`` count under ``"unknown"``. :class:`PassAtK` sums per ``data_source`` on each rank and
reduces the sums over all ranks (which may have seen different sources) before dividing.
"""

from __future__ import annotations

import csv
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from lit_agentrl.rewards import get_reward_fn, registered_rewards, resolve_reward_fn
from lit_agentrl.rewards.boxed import extract_boxed_answer
from lit_agentrl.rewards.digits import END_OF_TURN
from lit_agentrl.types import Trajectory

CORRECT_REWARD = 1.0
"""A trajectory with at least this reward (and not failed) is correct."""
UNKNOWN_SOURCE = "unknown"
"""The ``data_source`` of rows that name none."""
ALL_SOURCES = "all"
"""The table's row over every prompt (and the unprefixed ``val/pass@k`` keys)."""

AnswerExtractor = Callable[[str], "str | None"]
_EXTRACTORS: dict[str, AnswerExtractor] = {}


# ---------------------------------------------------------------------------------------------- estimators


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct, as a product (no huge binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_at_k(rewards: Sequence[float], k: int) -> float:
    """The expected mean reward of ``k`` of the ``n`` samples: the mean of all ``n`` (the lowest-variance estimate)."""
    _check_k(len(rewards), k)
    return sum(rewards) / len(rewards)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """1.0 when the majority answer of the first ``k`` samples is correct, else 0.0.

    ``answers[i]`` is None for a sample that does not vote (failed). Ties go to the answer seen first; the
    correctness is that of the first sample giving the winning answer. No votes at all score 0.0.
    """
    _check_k(len(answers), k)
    votes = Counter(a for a in answers[:k] if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    winner = next(a for a in answers[:k] if a is not None and votes[a] == top)
    return float(correct[answers.index(winner)])


def _check_k(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")


# ---------------------------------------------------------------------------------------------- answers


def register_answer_extractor(name: str) -> Callable[[AnswerExtractor], AnswerExtractor]:
    """Register how to cut the answer out of an output, for majority voting, under a reward name or data_source."""

    def decorator(fn: AnswerExtractor) -> AnswerExtractor:
        _EXTRACTORS[name] = fn
        return fn

    return decorator


for _boxed in ("math", "geo3k"):  # rewards that check the last \boxed{} answer
    register_answer_extractor(_boxed)(extract_boxed_answer)

_DIGIT_ANSWER = re.compile(r"\s*(\d)(?:" + "|".join(map(re.escape, END_OF_TURN)) + r")\s*")


@register_answer_extractor("next_digit")
def _digit_answer(text: str) -> str | None:
    """The digit of a well-formed ``next_digit`` answer (one digit, then end of turn)."""
    match = _DIGIT_ANSWER.fullmatch(text)
    return match.group(1) if match else None


def extract_answer(name: str | None, text: str) -> str:
    """The answer in ``text`` by the extractor registered under ``name`` (a reward name or data_source); the
    stripped text when there is none or it finds no answer."""
    extractor = _EXTRACTORS.get(name) if name else None
    answer = extractor(text) if extractor else None
    return answer if answer is not None else text.strip()


def extractor_name(row: Mapping[str, Any], default_reward: str | None) -> str | None:
    """The extractor for a row: its ``data_source`` when one is registered under it, else its reward's name."""
    source = row.get("data_source")
    if isinstance(source, str) and source in _EXTRACTORS:
        return source
    try:
        reward = resolve_reward_fn(row, default_reward)
    except KeyError:
        return None
    return next((name for name in registered_rewards() if get_reward_fn(name) is reward), None)


def data_source(row: Mapping[str, Any]) -> str:
    source = row.get("data_source")
    return source if isinstance(source, str) and source else UNKNOWN_SOURCE


# ---------------------------------------------------------------------------------------------- accumulation


@dataclass
class SourceSums:
    """Sums over one data_source's prompts; divided by ``prompts`` only once every rank's are added."""

    prompts: int
    samples: int
    passed: list[float]
    majority: list[float]
    mean_reward: float

    @classmethod
    def zero(cls, ks: int) -> SourceSums:
        return cls(0, 0, [0.0] * ks, [0.0] * ks, 0.0)

    def add(self, other: SourceSums) -> None:
        self.prompts += other.prompts
        self.samples += other.samples
        self.passed = [a + b for a, b in zip(self.passed, other.passed)]
        self.majority = [a + b for a, b in zip(self.majority, other.majority)]
        self.mean_reward += other.mean_reward


class PassAtK:
    """Accumulates ``pass@k``, ``maj@k`` and ``mean@k`` per data_source over validation batches (one per rank).

    :meth:`compute` is collective under ``torch.distributed``: every rank must call it.
    """

    def __init__(self, ks: Sequence[int]) -> None:
        if not ks or any(k < 1 for k in ks):
            raise ValueError(f"k values must be >= 1, got {list(ks)}")
        self.ks = sorted(set(ks))
        self.sums: dict[str, SourceSums] = {}

    def reset(self) -> None:
        self.sums = {}

    def update(
        self, rows: Sequence[Mapping[str, Any]], trajectories: Sequence[Trajectory], default_reward: str | None = None
    ) -> None:
        """Add one batch: ``trajectories[i].group`` indexes ``rows``."""
        groups: dict[int, list[Trajectory]] = defaultdict(list)
        for t in trajectories:
            groups[t.group].append(t)
        for group, members in groups.items():
            row = rows[group]
            self.add_prompt(
                data_source(row), sorted(members, key=lambda t: t.sample), extractor_name(row, default_reward)
            )

    def add_prompt(self, source: str, samples: Sequence[Trajectory], extractor: str | None = None) -> None:
        correct = [not t.failed and t.reward >= CORRECT_REWARD for t in samples]
        rewards = [0.0 if t.failed else t.reward for t in samples]
        answers = [None if t.failed else extract_answer(extractor, t.str_output) for t in samples]
        n = len(samples)
        if n < self.ks[-1]:
            raise ValueError(f"a prompt of {source!r} has {n} samples, fewer than k={self.ks[-1]}")
        sums = self.sums.setdefault(source, SourceSums.zero(len(self.ks)))
        sums.add(
            SourceSums(
                prompts=1,
                samples=n,
                passed=[pass_at_k(n, sum(correct), k) for k in self.ks],
                majority=[maj_at_k(answers, correct, k) for k in self.ks],
                mean_reward=mean_at_k(rewards, self.ks[-1]),
            )
        )

    def compute(self) -> EvalResult:
        """Every rank's sums added up (ranks may have seen different data sources)."""
        parts = [self.sums]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            parts = [{} for _ in range(dist.get_world_size())]
            dist.all_gather_object(parts, self.sums)
        return merge(self.ks, parts)


def merge(ks: Sequence[int], parts: Sequence[Mapping[str, SourceSums]]) -> EvalResult:
    """The result of several ranks' (or batches') sums."""
    total: dict[str, SourceSums] = {}
    for part in parts:
        for source, sums in part.items():
            total.setdefault(source, SourceSums.zero(len(ks))).add(sums)
    return EvalResult(list(ks), dict(sorted(total.items())))


# ---------------------------------------------------------------------------------------------- results


@dataclass
class EvalResult:
    """The reduced sums: metrics to log and the table (one row per data_source, then ``all``)."""

    ks: list[int]
    sources: dict[str, SourceSums]

    @property
    def overall(self) -> SourceSums:
        total = SourceSums.zero(len(self.ks))
        for sums in self.sources.values():
            total.add(sums)
        return total

    def figures(self, sums: SourceSums) -> dict[str, float]:
        """``pass@k``, ``maj@k``, ``mean@k`` of one row (0.0 without prompts)."""
        p = max(sums.prompts, 1)
        out = {f"pass@{k}": v / p for k, v in zip(self.ks, sums.passed)}
        out.update({f"maj@{k}": v / p for k, v in zip(self.ks, sums.majority)})
        out.update({f"mean@{k}": sums.mean_reward / p for k in self.ks})
        return out

    def metrics(self, prefix: str = "val") -> dict[str, float]:
        """``val/pass@k`` etc. over all prompts, and ``val/<data_source>/pass@k`` etc. per data_source."""
        out = {f"{prefix}/{key}": value for key, value in self.figures(self.overall).items()}
        for source, sums in self.sources.items():
            out.update({f"{prefix}/{source}/{key}": value for key, value in self.figures(sums).items()})
        return out

    @property
    def columns(self) -> list[str]:
        names = [f"{kind}@{k}" for kind in ("pass", "maj", "mean") for k in self.ks]
        return ["data_source", "prompts", "samples_per_prompt", *names]

    def rows(self) -> list[list[Any]]:
        named = [*self.sources.items(), (ALL_SOURCES, self.overall)]
        return [[source, sums.prompts, _per_prompt(sums), *self.figures(sums).values()] for source, sums in named]

    def markdown(self) -> str:
        def cell(value: Any) -> str:
            return f"{value:.4f}" if isinstance(value, float) else str(value)

        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in self.rows()]
        return "\n".join(lines)

    def write(self, folder: Path, step: int) -> Path:
        """``folder/step_{step:06d}.csv`` and its ``.md`` twin; returns the CSV's path."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"step_{step:06d}.csv"
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(self.columns)
            writer.writerows(self.rows())
        path.with_suffix(".md").write_text(self.markdown() + "\n")
        return path


def _per_prompt(sums: SourceSums) -> int | float:
    """Samples per prompt: an integer when every prompt had as many (the usual case), else their mean."""
    mean = sums.samples / max(sums.prompts, 1)
    return int(mean) if mean.is_integer() else round(mean, 2)
