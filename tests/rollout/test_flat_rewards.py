"""The flat-reward warning: rewards without signal are said out loud, with their likely causes."""

from __future__ import annotations

import pytest

from lit_agentrl.rollout.flat_rewards import FlatRewardWatch
from lit_agentrl.rollout.metrics import flat_groups
from lit_agentrl.types import Trajectory


def test_flat_groups_counts_groups_whose_rewards_are_all_equal():
    rewards = {(0, 0): 1.0, (0, 1): 1.0, (1, 0): 0.0, (1, 1): 1.0, (2, 0): 0.5}  # group 2 has one trajectory
    trajectories = [Trajectory(g, s, "a", reward=r) for (g, s), r in rewards.items()]
    assert flat_groups(trajectories) == [1.0, 0.0]


def test_warns_after_n_flat_steps_in_a_row_and_names_a_constant_reward():
    watch = FlatRewardWatch(3)
    assert [watch.update(1.0, 0.0, 0.0) for _ in range(2)] == [None, None]
    warning = watch.update(1.0, 0.0, 0.0)
    assert "last 3 steps: every reward was 0" in warning and "ground truth" in warning and "data_source" in warning
    assert [watch.update(1.0, 0.0, 0.0) for _ in range(2)] == [None, None]
    assert "last 6 steps" in watch.update(1.0, 0.0, 0.0)  # and again every 3 flat steps


def test_a_step_with_signal_restarts_the_count_and_varying_flat_groups_are_not_called_constant():
    watch = FlatRewardWatch(2)
    assert watch.update(1.0, 0.0, 1.0) is None
    assert watch.update(0.5, 0.0, 1.0) is None  # one group had a signal
    assert watch.update(1.0, 0.0, 1.0) is None
    warning = watch.update(1.0, 0.0, 1.0)
    assert "last 2 steps." in warning and "every reward was" not in warning
    assert all(FlatRewardWatch(0).update(1.0, 0.0, 0.0) is None for _ in range(10))


def test_a_negative_step_count_is_refused():
    with pytest.raises(ValueError, match="flat_reward_warn_steps"):
        FlatRewardWatch(-1)
