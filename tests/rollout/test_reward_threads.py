"""Rewards run in the manager's reward threads: a slow reward holds up neither generation nor the other rewards.

The rewards here wait for things only the event loop or the other rewards can do (with a deadline), so on the
event loop, or one after another, they would time out: the checks do not depend on how loaded the machine is.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, ClassVar

import pytest
from support import ScriptedEngine

from lit_agentrl.rewards import register_reward
from lit_agentrl.rollout.manager import RolloutManager

DEADLINE_S = 10.0
SLEEP_S = 0.5  # 1 s of slack below the 6 x SLEEP_S that counting waits would give
SAMPLING = {"max_new_tokens": 16, "temperature": 1.0}


class Gate:
    """What the gated engine and the waiting reward tell each other."""

    reward_running = threading.Event()
    served_during_reward = threading.Event()
    reward_threads: ClassVar[list[str]] = []

    @classmethod
    def reset(cls) -> None:
        cls.reward_running.clear()
        cls.served_during_reward.clear()
        cls.reward_threads.clear()


@register_reward("test_waiting_reward")
def waiting_reward(completion: str, ground_truth: str | None, **row: object) -> float:
    """Pays 1 only if the engine answers a request while this reward runs."""
    Gate.reward_threads.append(threading.current_thread().name)
    Gate.reward_running.set()
    return 1.0 if Gate.served_during_reward.wait(DEADLINE_S) else 0.0


class GatedEngine(ScriptedEngine):
    """Scripted replies; holds every request after the first two until a reward is running."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = 0

    async def async_generate(self, *args: Any, **kwargs: Any) -> dict:
        self.started += 1
        if self.started > 2:
            deadline = time.perf_counter() + DEADLINE_S
            while not Gate.reward_running.is_set() and time.perf_counter() < deadline:
                await asyncio.sleep(0.005)
        output = await super().async_generate(*args, **kwargs)
        if Gate.reward_running.is_set():
            Gate.served_during_reward.set()
        return output


MEETING = threading.Barrier(4, timeout=DEADLINE_S)


@register_reward("test_meeting_reward")
def meeting_reward(completion: str, ground_truth: str | None, **row: object) -> float:
    """Returns once four such rewards run at the same time (raises ``BrokenBarrierError`` past the deadline)."""
    MEETING.wait()
    return 1.0


@register_reward("test_sleepy_reward")
def sleepy_reward(completion: str, ground_truth: str | None, **row: object) -> float:
    time.sleep(SLEEP_S)
    return 1.0


@register_reward("test_raising_reward")
def raising_reward(completion: str, ground_truth: str | None, **row: object) -> float:
    raise RuntimeError("reward exploded")


def chat_row(data_source: str, ground_truth: str = "x") -> dict:
    prompt = [{"role": "user", "content": "hi"}]
    return {"agent_name": "single_turn", "prompt": prompt, "ground_truth": ground_truth, "data_source": data_source}


def test_generation_goes_on_while_a_reward_runs(policy_model, tokenizer):
    Gate.reset()
    engine = GatedEngine(policy_model, tokenizer, ["0"] * 4)
    # A single-turn trajectory whose reward waits, and a three-turn game (it scores itself) whose later turns
    # the engine serves only once that reward is running.
    game = {"agent_name": "guess_digit", "prompt": [{"role": "user", "content": "guess"}], "secret": 7}
    manager = RolloutManager([engine], tokenizer)
    try:
        batch = manager.generate([chat_row("test_waiting_reward"), game], n_samples=1, sampling_params=SAMPLING)
    finally:
        manager.close()
    assert batch.stats.num_failed == 0, batch.stats.failure_reasons
    assert batch.trajectories[0].reward == 1.0
    assert batch.trajectories[1].num_model_turns == 3 and engine.started == 4
    assert Gate.reward_threads and Gate.reward_threads[0].startswith("lit-agentrl-reward")
    assert threading.main_thread().name not in Gate.reward_threads


def test_rewards_run_at_the_same_time(scripted_engine_factory, tokenizer):
    MEETING.reset()
    manager = RolloutManager([scripted_engine_factory(["0"] * 4)], tokenizer)
    try:
        batch = manager.generate([chat_row("test_meeting_reward")], n_samples=4, sampling_params=SAMPLING)
    finally:
        manager.close()
    assert batch.stats.num_failed == 0, batch.stats.failure_reasons
    assert [t.reward for t in batch.trajectories] == [1.0] * 4


def test_reward_seconds_count_the_rewards_own_time(scripted_engine_factory, tokenizer):
    # One reward thread: the three rewards run one after another; the later ones' wait is not reward time.
    manager = RolloutManager([scripted_engine_factory(["0"] * 3)], tokenizer, reward_workers=1)
    try:
        batch = manager.generate([chat_row("test_sleepy_reward")], n_samples=3, sampling_params=SAMPLING)
    finally:
        manager.close()
    assert batch.stats.num_failed == 0, batch.stats.failure_reasons
    assert 3 * SLEEP_S <= batch.stats.reward_seconds < 5 * SLEEP_S  # waits included would make it 6 * SLEEP_S


def test_math_reward_is_correct_in_a_reward_thread(scripted_engine_factory, tokenizer):
    # math-verify's signal.alarm timeout cannot work off the main thread: it must be off there, not fail.
    engine = scripted_engine_factory([r"So $x = \boxed{\frac{1}{2}}$.", r"So $x = \boxed{\frac{1}{3}}$."])
    rows = [chat_row("math", ground_truth="0.5"), chat_row("math", ground_truth="0.5")]
    manager = RolloutManager([engine], tokenizer)
    try:
        batch = manager.generate(rows, n_samples=1, sampling_params={**SAMPLING, "max_new_tokens": 64})
    finally:
        manager.close()
    assert batch.stats.num_failed == 0, batch.stats.failure_reasons
    assert [t.reward for t in batch.trajectories] == [1.0, 0.0]


def test_a_raising_reward_is_a_counted_failure_and_close_stops_the_threads(scripted_engine_factory, tokenizer):
    manager = RolloutManager([scripted_engine_factory(["0"] * 4)], tokenizer, reward_workers=2)
    batch = manager.generate([chat_row("test_raising_reward")], n_samples=2, sampling_params=SAMPLING)
    assert batch.stats.num_failed == 2
    assert batch.trajectories[0].failure_reason == "RuntimeError: reward exploded"
    pool = manager._reward_pool
    assert pool is not None and 1 <= len(pool._threads) <= 2
    manager.close()
    assert manager._reward_pool is None and not any(t.is_alive() for t in pool._threads)
    # a closed manager starts its threads (and loop) again when used again
    batch = manager.generate([chat_row("test_raising_reward")], n_samples=2, sampling_params=SAMPLING)
    assert batch.stats.num_failed == 2
    manager.close()


def test_reward_workers_must_be_positive(tokenizer):
    with pytest.raises(ValueError, match="reward_workers"):
        RolloutManager([object()], tokenizer, reward_workers=0)
