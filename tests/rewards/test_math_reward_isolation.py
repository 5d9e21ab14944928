"""Off the main thread the math reward checks answers in worker processes under a hard time limit.

Answers such as ``9^{9^{9^{9}}}`` keep sympy in C integer arithmetic; without math-verify's alarm (main thread
only) they froze the whole process. These tests run them from worker threads, as the rollout manager does.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from lit_agentrl.rewards import math as math_reward
from lit_agentrl.rewards.math import compute_math_reward, is_equiv
from lit_agentrl.rewards.verify_pool import VerifyPool, VerifyPoolError, VerifyTimeout

PATHOLOGICAL = [r"10^{10^{10^{10}}}", r"9^{9^{9^{9}}}", r"(x+1)^{100000}"]
"""Measured: on the main thread each returns False in ~3 s (the alarm); in a thread they froze the process (the
first two) or held a reward thread for over 20 s (the last)."""

PAIRS = [
    (r"\frac{1}{2}", "0.5"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    ("x=3", "3"),
    ("(1,2]", "(1, 2]"),
    ("(x+1)^2", "x^2+2x+1"),
    ("5", "6"),
    ("0.33", r"\frac{1}{3}"),
    ("(1,2)", "[1,2]"),
    ("asdf}{", "3"),
]
MATH_TARGET = f"{math_reward.__name__}:{math_reward._worker_verify.__name__}"


def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a fresh (non-main) thread, as the rollout manager's reward threads call rewards."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result(timeout=120)


@pytest.fixture()
def quick_kill_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[VerifyPool]:
    """The math reward's pool with a 1.5 s hard limit: the pathological answers (~3 s to the alarm) hit it."""
    pool = VerifyPool(MATH_TARGET, workers=2, hard_limit_s=1.5)
    monkeypatch.setattr(math_reward, "_pool", pool)
    yield pool
    pool.close()


class StubPool:
    """Stands in for the math reward's pool: every call fails with ``error``."""

    hard_limit_s = 10.0

    def __init__(self, error: Exception) -> None:
        self.error = error

    def call(self, *args: Any) -> Any:
        raise self.error


# --- fast: no worker process ---


def test_main_thread_checks_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(math_reward, "_pool", StubPool(AssertionError("the main thread used the pool")))
    assert is_equiv(r"\frac{1}{2}", "0.5")
    assert compute_math_reward(r"\boxed{\frac{1}{2}}", "0.5") == 1.0
    assert not is_equiv("5", "6")


@pytest.mark.parametrize(
    ("error", "fragment"),
    [(VerifyTimeout("no answer in time"), "worker process was killed"), (VerifyPoolError("crashed"), "crashed")],
)
def test_worker_failure_is_false_and_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception, fragment: str
) -> None:
    monkeypatch.setattr(math_reward, "_pool", StubPool(error))
    answer = "9^{9^{9^{9}}}" + "+1" * 100
    with caplog.at_level(logging.WARNING, logger=math_reward.__name__):
        assert in_thread(compute_math_reward, rf"\boxed{{{answer}}}", "3") == 0.0
    (record,) = caplog.records
    assert fragment in record.getMessage()
    assert repr(answer[:80]) in record.getMessage()  # named, truncated
    assert answer not in record.getMessage()


def test_cheap_answers_skip_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(math_reward, "_pool", StubPool(AssertionError("the pool was used")))
    assert in_thread(is_equiv, "3", " 3 ")  # equal text
    assert not in_thread(is_equiv, "", "3")
    assert not in_thread(is_equiv, "1+" * math_reward.MAX_ANSWER_CHARS, "3")


def test_pool_arguments_checked() -> None:
    with pytest.raises(ValueError, match="workers"):
        VerifyPool(MATH_TARGET, workers=0, hard_limit_s=1)
    with pytest.raises(ValueError, match="hard_limit_s"):
        VerifyPool(MATH_TARGET, workers=1, hard_limit_s=0)


# --- the process path (the process-wide pool; its workers start once, ~1.5 s) ---


def test_reward_off_main_thread_goes_through_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    assert in_thread(compute_math_reward, r"\boxed{\frac{1}{2}}", "0.5") == 1.0
    assert in_thread(compute_math_reward, r"\boxed{\frac{1}{3}}", "0.5") == 0.0
    parsed_here: list[object] = []
    monkeypatch.setattr(math_reward, "parse", lambda *a, **k: parsed_here.append(a))
    off_main = [in_thread(is_equiv, pred, truth) for pred, truth in PAIRS]
    assert not parsed_here  # parsed in the worker, not in this process
    monkeypatch.undo()
    on_main = [is_equiv(pred, truth) for pred, truth in PAIRS]
    assert off_main == on_main == [True] * 5 + [False] * 4


@pytest.mark.slow
def test_pathological_answers_return_false_in_bounded_time() -> None:
    start = time.monotonic()
    results = in_thread(lambda: [is_equiv(answer, "3") for answer in PATHOLOGICAL])
    elapsed = time.monotonic() - start
    assert results == [False] * len(PATHOLOGICAL)
    # Each ends at the worker's 3 s alarm (~10 s for the three, one after another); at worst at HARD_LIMIT_S.
    assert elapsed < 30, elapsed
    assert in_thread(compute_math_reward, r"\boxed{\frac{1}{2}}", "0.5") == 1.0


@pytest.mark.slow
def test_stuck_worker_is_killed_and_replaced(quick_kill_pool: VerifyPool, caplog: pytest.LogCaptureFixture) -> None:
    assert in_thread(is_equiv, "1/2", "0.5")  # workers up
    before = {worker.proc.pid for worker in quick_kill_pool._live}
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=math_reward.__name__):
        assert not in_thread(is_equiv, PATHOLOGICAL[1], "3")
    assert time.monotonic() - start < 15  # the 1.5 s limit, the kill and the replacement's start
    assert any("was killed" in r.getMessage() and PATHOLOGICAL[1] in r.getMessage() for r in caplog.records)
    after = {worker.proc.pid for worker in quick_kill_pool._live}
    assert len(after) == 2 and len(before - after) == 1  # one worker killed and replaced, the other kept
    assert in_thread(compute_math_reward, r"\boxed{\frac{1}{2}}", "0.5") == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True], ids=["alarm", "hard-limit"])
def test_concurrent_calls_with_a_pathological_one(kill: bool, request: pytest.FixtureRequest) -> None:
    if kill:
        request.getfixturevalue("quick_kill_pool")
    calls = [*PAIRS[:3], (PATHOLOGICAL[0], "3"), *PAIRS[5:8], (PATHOLOGICAL[2], "3")]
    start = time.monotonic()
    with ThreadPoolExecutor(4) as threads:  # as many as the rollout manager's reward threads
        futures = [threads.submit(is_equiv, pred, truth) for pred, truth in calls]
        results = [future.result(timeout=60) for future in futures]
    assert time.monotonic() - start < 30
    assert results[3] is False and results[7] is False
    normal = [results[i] for i in (0, 1, 2, 4, 5, 6)]
    wanted = [is_equiv(*calls[i]) for i in (0, 1, 2, 4, 5, 6)]  # main thread: in process
    assert all(got in (want, False) for got, want in zip(normal, wanted, strict=True))
    if not kill:  # with the real limit nothing is killed: every other answer is scored right
        assert normal == wanted


# --- the pool itself, on stdlib targets (no alarm: time.sleep just blocks) ---


@pytest.mark.slow
def test_pool_kills_only_the_stuck_worker_and_closes() -> None:
    pool = VerifyPool("time:sleep", workers=2, hard_limit_s=1.0)
    try:
        assert pool.call(0) is None
        with ThreadPoolExecutor(3) as threads:
            stuck = threads.submit(pool.call, 600)
            time.sleep(0.2)
            quick = [threads.submit(pool.call, 0.05) for _ in range(5)]  # served by the other worker meanwhile
            assert [f.result(timeout=30) for f in quick] == [None] * 5
            with pytest.raises(VerifyTimeout):
                stuck.result(timeout=30)
        assert pool.call(0) is None  # the replacement serves
        workers = list(pool._live)
    finally:
        pool.close()
    assert all(worker.proc.poll() is not None for worker in workers)
    with pytest.raises(VerifyPoolError, match="closed"):
        pool.call(0)


@pytest.mark.slow
def test_close_releases_calls_in_flight_and_waiting() -> None:
    pool = VerifyPool("time:sleep", workers=1, hard_limit_s=600)
    assert pool.call(0) is None
    with ThreadPoolExecutor(3) as threads:
        running = threads.submit(pool.call, 600)
        waiting = [threads.submit(pool.call, 0) for _ in range(2)]  # no free worker: they wait for the slot
        time.sleep(0.5)
        start = time.monotonic()
        pool.close()
        for future in [running, *waiting]:
            with pytest.raises(VerifyPoolError):
                future.result(timeout=30)
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_crashed_worker_is_replaced() -> None:
    pool = VerifyPool("os:_exit", workers=1, hard_limit_s=30)
    try:
        with pytest.raises(VerifyPoolError, match="exited"):
            pool.call(3)
        with pytest.raises(VerifyPoolError, match="exited"):
            pool.call(3)  # a fresh worker took the call
    finally:
        pool.close()
    pool = VerifyPool("math:sqrt", workers=1, hard_limit_s=30)
    try:
        with pytest.raises(VerifyPoolError, match="ValueError"):
            pool.call(-1)
        assert pool.call(4) == 2.0
    finally:
        pool.close()


@pytest.mark.slow
def test_workers_do_not_outlive_the_interpreter() -> None:
    script = textwrap.dedent(
        """
        import threading
        from lit_agentrl.rewards import math as math_reward

        out = []
        worker = threading.Thread(target=lambda: out.append(math_reward.is_equiv("1/2", "0.5")))
        worker.start()
        worker.join()
        print(out[0], *(w.proc.pid for w in math_reward._pool._live))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    verdict, *pids = done.stdout.split()
    assert verdict == "True" and len(pids) == math_reward.VERIFY_WORKERS
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(int(pid)) for pid in pids):
        time.sleep(0.1)
    assert not any(_alive(int(pid)) for pid in pids)


def _check_in_forked_child(results: Any) -> None:
    results.put((in_thread(is_equiv, "1/2", "0.5"), len(math_reward._verify_pool()._live)))


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_forked_child_does_not_share_the_parents_workers() -> None:
    import multiprocessing

    assert in_thread(is_equiv, "1/2", "0.5")  # the parent's workers are up
    parents = {worker.proc.pid for worker in math_reward._verify_pool()._live}
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_check_in_forked_child, args=(results,))
    child.start()
    assert results.get(timeout=60) == (True, math_reward.VERIFY_WORKERS)  # its own workers, started afresh
    child.join(timeout=30)
    assert child.exitcode == 0
    assert {worker.proc.pid for worker in math_reward._verify_pool()._live} == parents
    assert in_thread(is_equiv, "1/2", "0.5") and not in_thread(is_equiv, "1/3", "0.5")  # pipes not mixed up


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return True


@pytest.mark.slow
def test_main_thread_check_stays_bounded_by_the_alarm() -> None:
    """Unchanged: the main thread's path is in process, each step under the alarm (no hard limit needed)."""
    assert threading.current_thread() is threading.main_thread()
    start = time.monotonic()
    assert not is_equiv(PATHOLOGICAL[1], "3")
    assert time.monotonic() - start < 20
