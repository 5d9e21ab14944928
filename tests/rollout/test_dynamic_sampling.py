"""DAPO's dynamic sampling: which groups are kept, how many rounds are drawn, and the extra prompt stream."""

from __future__ import annotations

from lit_agentrl.data import PromptBatchLoader
from lit_agentrl.rollout.dynamic import dynamic_rollout, informative_groups
from lit_agentrl.types import RolloutBatch, RolloutStats, Trajectory


# Rewards per prompt (2 samples each): a prompt named "flat..." gets equal rewards, any other two different ones.
def fake_generate(rows, round_):
    trajectories = [
        Trajectory(
            group,
            sample,
            "a",
            [1],
            [1, 2],
            [0, 1],
            [-0.1],
            reward=0.0 if row["name"].startswith("flat") else float(sample),
        )
        for group, row in enumerate(rows)
        for sample in range(2)
    ]
    return RolloutBatch(trajectories, RolloutStats(), temperature=1.0)


def test_informative_groups_ignore_failed_trajectories():
    ok = Trajectory(0, 0, "a", reward=1.0)
    failed = Trajectory(0, 1, "a", failed=True, reward=0.0)
    assert informative_groups([ok, failed, Trajectory(1, 0, "a", reward=0.0), Trajectory(1, 1, "a", reward=1.0)]) == [1]


def test_a_sequence_scored_on_its_own_makes_its_group_informative():
    from lit_agentrl.types import TokenSequence

    scored = Trajectory(0, 0, "a", reward=1.0, other_sequences=[TokenSequence([1], [1, 2], [0, 1], [0.0], reward=0.0)])
    assert informative_groups([scored, Trajectory(0, 1, "a", reward=1.0)]) == [0]
    assert informative_groups([Trajectory(0, 0, "a", reward=1.0), Trajectory(0, 1, "a", reward=1.0)]) == []


def test_extra_rounds_until_the_step_has_its_informative_groups():
    rows = [{"name": n} for n in ("flat0", "a", "flat1", "b")]
    extras = iter([[{"name": "flat2"}, {"name": "c"}, {"name": "flat3"}, {"name": "flat4"}], [{"name": "d"}] * 4])
    result = dynamic_rollout(rows, fake_generate, lambda: next(extras), global_sum=lambda v: v, max_rounds=5)
    assert result.rounds == 2  # 2 informative, then 3, then 3 + 4 >= 4
    assert [r["name"] for r in result.rows] == ["a", "b", "c", "d"]  # in the order drawn, at most the share
    assert sorted({t.group for t in result.rollout.trajectories}) == [0, 1, 2, 3]
    assert all(result.rows[t.group]["name"] != "flat" for t in result.rollout.trajectories)
    assert result.dropped_groups == 12 - 4 and len(result.generated) == 24
    assert result.rollout.stats.num_trajectories == 24  # the step's statistics cover every round


def test_rounds_are_bounded_and_flat_groups_never_trained():
    rows = [{"name": "flat"}, {"name": "a"}]
    result = dynamic_rollout(rows, fake_generate, lambda: [{"name": "flat"}] * 2, lambda v: v, max_rounds=3)
    assert result.rounds == 3 and [r["name"] for r in result.rows] == ["a"] and result.dropped_groups == 7


def test_the_extra_stream_is_split_across_ranks_and_resumes_exactly():
    rows = [{"name": str(i)} for i in range(10)]
    ranks = [PromptBatchLoader(rows, 4, seed=3, shuffle=True, rank=r, world_size=2, split="train") for r in (0, 1)]
    first = [loader.draw_extra() for loader in ranks]
    assert len(first[0]) == len(first[1]) == 2 and not {r["name"] for r in first[0]} & {r["name"] for r in first[1]}
    state = ranks[0].state_dict()
    assert state["extra_drawn"] == 4
    expected = [ranks[0].draw_extra() for _ in range(4)]  # past one shuffle of the 10 rows into the next
    resumed = PromptBatchLoader(rows, 4, seed=3, shuffle=True, rank=0, world_size=2, split="train")
    resumed.load_state_dict(state)
    assert [resumed.draw_extra() for _ in range(4)] == expected
