"""The ``math`` reward: the last ``\\boxed{...}`` answer of a completion checked against the ground truth.

Extraction is :mod:`lit_agentrl.rewards.boxed` (shared with the MATH data preparation script); equivalence is
delegated to ``math-verify`` (LaTeX -> sympy, then numeric/symbolic checks). Off the main thread the check runs in
a worker process (:mod:`lit_agentrl.rewards.verify_pool`), see :func:`is_equiv`.
"""

from __future__ import annotations

import logging
import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from lit_agentrl.rewards.boxed import extract_boxed_answer, last_boxed_only_string
from lit_agentrl.rewards.registry import register_reward
from lit_agentrl.rewards.verify_pool import VerifyPool, VerifyTimeout

__all__ = [
    "MAX_ANSWER_CHARS",
    "compute_math_reward",
    "extract_boxed_answer",
    "ground_truth_problem",
    "is_equiv",
    "last_boxed_only_string",
]

logger = logging.getLogger(__name__)

MAIN_THREAD_TIMEOUT_S = 3
"""Per-step parse/verify timeout (whole seconds; math-verify uses ``signal.alarm``, so only on a main thread: the
caller's, or a verify worker's)."""

HARD_LIMIT_S = MAIN_THREAD_TIMEOUT_S * 2 + 4
"""Longest wait for a verify worker's answer (seconds), after which the worker is killed and the answer scores
False. Inside the worker each parse or verify step gets the alarm's ``MAIN_THREAD_TIMEOUT_S``, and the answers
that need it end there (measured: ``9^{9^{9^{9}}}``, ``(x+1)^{100000}`` return False in ~3.2 s); a check needing
two timed-out steps is still let finish, plus a margin for a loaded machine and the process hop. Only a check
that the alarm cannot stop (C code holding the interpreter lock, where the signal handler never gets to run) or
that times out step after step reaches this limit, and for those the alarm alone would give False all but
always. The cost of a kill: the worker's replacement starts (~1.5 s, in the background)."""

VERIFY_WORKERS = 2
"""Worker processes that check answers for callers off the main thread (one call each at a time); read when the
pool starts (the first such call)."""

MAX_ANSWER_CHARS = 1000
"""Longer answers are rejected without parsing. A cheap first bound: length alone does not make an answer safe
(the power tower ``9^{9^{9^{9}}}`` is short), which is why off the main thread, where math-verify's alarm cannot
work, the check runs in a worker process under ``HARD_LIMIT_S``."""

_EXTRACTION_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


def _timeout_s() -> int | None:
    """math-verify's timeout uses ``signal.alarm``, which raises off the main thread. (Only
    :func:`ground_truth_problem`, a setup-time check of the data, still parses in process off the main thread.)"""
    if threading.current_thread() is threading.main_thread():
        return MAIN_THREAD_TIMEOUT_S
    return None


def _normalise(text: str) -> str:
    return "".join(text.split())


def _parse_answer(answer: str, timeout_s: int | None) -> list[object]:
    """Parse a bare answer, preferring a ``\\boxed{}`` wrap so LaTeX extraction anchors on it.

    Falls back to the raw string (e.g. already ``$``-delimited) when the wrap
    yields no sympy object; a string-only fallback result is kept as last resort.
    """
    fallback: list[object] = []
    for candidate in (f"\\boxed{{{answer}}}", answer):
        parsed = parse(
            candidate,
            extraction_config=_EXTRACTION_CONFIG,
            parsing_timeout=timeout_s,  # None disables the alarm
        )
        if any(not isinstance(item, str) for item in parsed):
            return parsed
        fallback = fallback or parsed
    return fallback


def is_equiv(pred: str, ground_truth: str, verbose: bool = False) -> bool:
    """Whether ``pred`` and ``ground_truth`` are the same mathematical answer (``verbose`` is accepted for the seed's
    signature and unused).

    Handles ``\\frac{1}{2}``/``0.5``/``1/2``, ``\\sqrt{8}``/``2\\sqrt{2}``,
    intervals, ``x=3``/``3`` and similar via math-verify. Never raises: any
    error, empty input or input over ``MAX_ANSWER_CHARS`` gives False.

    On the main thread math-verify runs here, each step bounded by its alarm
    (``MAIN_THREAD_TIMEOUT_S``). Off it (the rollout manager's reward threads,
    an agent's executor) the alarm cannot work and some answers would freeze the
    whole process, so the check runs on the main thread of one of
    ``VERIFY_WORKERS`` worker processes (started on the first such call, ~1.5 s),
    alarm included, and a worker that has not answered within ``HARD_LIMIT_S`` is
    killed and replaced: the answer scores False, with a logged warning. Safe to
    call from many threads at once.
    """
    try:
        if not pred.strip() or not ground_truth.strip():
            return False
        if _normalise(pred) == _normalise(ground_truth):
            return True  # cheap, and covers answers sympy cannot parse
        if max(len(pred), len(ground_truth)) > MAX_ANSWER_CHARS:
            return False
        if threading.current_thread() is threading.main_thread():
            return _verify(pred, ground_truth, MAIN_THREAD_TIMEOUT_S)
        return _verify_in_worker(pred, ground_truth)
    except (Exception, TimeoutException):  # a reward must never crash a rollout
        return False  # (TimeoutException derives from BaseException, hence listed)


def _verify(pred: str, ground_truth: str, timeout_s: int | None) -> bool:
    gold = _parse_answer(ground_truth, timeout_s)
    target = _parse_answer(pred, timeout_s)
    if not gold or not target:
        return False
    # verify is asymmetric (gold first), e.g. for "x=3" vs "3" simplification.
    return bool(verify(gold, target, timeout_seconds=timeout_s))


def _worker_verify(pred: str, ground_truth: str) -> bool:
    """A verify worker's target (run on its main thread, so math-verify's alarm works)."""
    try:
        return _verify(pred, ground_truth, MAIN_THREAD_TIMEOUT_S)
    except (Exception, TimeoutException):
        return False


_pool: VerifyPool | None = None
_pool_lock = threading.Lock()


def _verify_pool() -> VerifyPool:
    """The process-wide pool, made on first use (its workers start on its first call)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = VerifyPool(f"{__name__}:{_worker_verify.__name__}", VERIFY_WORKERS, HARD_LIMIT_S)
        return _pool


def _verify_in_worker(pred: str, ground_truth: str) -> bool:
    """The check in a verify worker. A stuck worker is killed alone: calls running in the other workers finish
    normally, calls waiting for a worker get its fresh replacement, and a worker killed under a call (the pool
    closed at exit, the kernel's OOM killer) makes that call False with a warning, like a timeout."""
    pool = _verify_pool()
    try:
        return bool(pool.call(pred, ground_truth))
    except VerifyTimeout:
        logger.warning(
            "math reward: no verdict within %ss on the answer %s (ground truth %s); its worker process was killed "
            "and the answer is judged wrong",
            pool.hard_limit_s,
            _clip(pred),
            _clip(ground_truth),
        )
    except Exception as exc:  # a worker that crashed or could not start: say so, do not fail the rollout
        logger.warning("math reward: checking the answer %s failed (%s); it is judged wrong", _clip(pred), exc)
    return False


def _clip(text: str, limit: int = 80) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} chars)"


@register_reward("math")
def compute_math_reward(completion: str, ground_truth: str, **row: object) -> float:
    """1.0 if the completion's last boxed answer equals ``ground_truth``, else 0.0.

    ``row`` holds the dataset row's other fields and is ignored.
    """
    answer = extract_boxed_answer(completion)
    if answer is None:
        return 0.0
    return 1.0 if is_equiv(answer, ground_truth) else 0.0


def ground_truth_problem(ground_truth: object) -> str | None:
    """Why ``ground_truth`` cannot serve as a math answer key (checked at setup), or None."""
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        return f"must be a non-empty string, got {ground_truth!r}"
    if len(ground_truth) > MAX_ANSWER_CHARS:
        return f"is longer than {MAX_ANSWER_CHARS} characters"
    try:
        parsed = _parse_answer(ground_truth, _timeout_s())
    except (Exception, TimeoutException):
        parsed = []
    if not any(not isinstance(item, str) for item in parsed):
        return f"{ground_truth!r} cannot be parsed by math-verify into an expression, so no answer could match it"
    return None


compute_math_reward.check_ground_truth = ground_truth_problem  # type: ignore[attr-defined]  # a function attribute (RewardFn)
