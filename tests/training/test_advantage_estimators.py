"""The turn-level advantage estimators against values derived by hand, and the turns of real multi-turn games.

Most hand values use gamma = 0.5 and ``std="none"``, so every number is a short binary fraction and the estimators
must match them exactly; the std modes are checked with ``pytest.approx`` (the normaliser adds 1e-6 to the std).
"""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch

from lit_agentrl.agents.guess_digit import GuessDigitAgentGraph
from lit_agentrl.training.advantage_estimators import (
    ESTIMATORS,
    AdvantageParams,
    Episode,
    Turn,
    discounted_returns,
    gae,
    gigpo,
    grpo,
    lambda_returns,
    step_group_sizes,
    turn_returns,
)
from lit_agentrl.training.losses import grpo_advantages
from lit_agentrl.turns import context_images, turn_anchor, turn_spans


def episode(group: int, anchors: str, outcome: float, rewards: list[float] | None = None) -> Episode:
    """An episode whose turn t has anchor ``anchors[t]`` (one letter per turn) and turn reward ``rewards[t]``."""
    rewards = rewards or [0.0] * len(anchors)
    return Episode(group, tuple(Turn(a, r) for a, r in zip(anchors, rewards)), outcome)


def close(actual: list[list[float]], expected: list[list[float]], rel: float = 1e-6) -> bool:
    """Per-turn advantages equal in shape and approximately in value."""
    return [len(a) for a in actual] == [len(e) for e in expected] and [x for a in actual for x in a] == pytest.approx(
        [x for e in expected for x in e], rel=rel
    )


def params(
    std: str = "none",
    gamma: float = 0.5,
    step_weight: float = 1.0,
    step_groups: str = "group",
    lam: float = 1.0,
    step_first_turn: bool = True,
) -> AdvantageParams:
    return AdvantageParams(std, gamma, step_weight, step_groups, lam, step_first_turn)


GROUP_RELATIVE = {name: f for name, f in ESTIMATORS.items() if name != "gae"}
"""The estimators that compare a turn with the other trajectories of its group (gae compares it with its critic)."""


# Group 0: every first turn has the prompt's context P. E1 and E2 both answered X at turn 2 from the same context
# (anchor X repeats); E2's third turn (Y) and E3's second (Z) have contexts no other turn has. E4 ends after one
# turn. E2 earns a turn reward of 0.5 on its second turn. Group 1 reuses the anchor X, which must not join group
# 0's step group X (step groups stay within a prompt group).
MIXED = [
    episode(0, "PX", 1.0),  # E1: rewards [0, 1]
    episode(0, "PXY", 0.0, [0.0, 0.5, 0.0]),  # E2: rewards [0, 0.5, 0]
    episode(0, "PZ", 0.0),  # E3: rewards [0, 0]
    episode(0, "P", 1.0),  # E4: rewards [1]
    episode(1, "QX", 0.0),  # E5: rewards [0, 0]
    episode(1, "QX", 1.0),  # E6: rewards [0, 1]
]


def test_discounted_returns_by_hand():
    # R_3 = 4; R_2 = 2 + 0.5 * 4 = 4; R_1 = 1 + 0.5 * 4 = 3
    assert discounted_returns([1.0, 2.0, 4.0], 0.5) == [3.0, 4.0, 4.0]
    assert discounted_returns([1.0, 2.0, 4.0], 0.0) == [1.0, 2.0, 4.0]
    assert discounted_returns([1.0, 2.0, 4.0], 1.0) == [7.0, 6.0, 4.0]


def test_grpo_gives_every_turn_its_trajectorys_group_normalised_return():
    # Returns R(tau) = outcome + turn rewards: group 0: E1 1, E2 0.5, E3 0, E4 1, mean 2.5 / 4 = 0.625
    #   -> 0.375, -0.125, -0.625, 0.375; group 1: E5 0, E6 1, mean 0.5 -> -0.5, 0.5.
    assert grpo(MIXED, params()) == [
        [0.375, 0.375],
        [-0.125, -0.125, -0.125],
        [-0.625, -0.625],
        [0.375],
        [-0.5, -0.5],
        [0.5, 0.5],
    ]


def test_gigpo_by_hand_with_repeated_and_unique_anchors_and_different_lengths():
    # A^E (Eq. 3) is grpo's: E1 0.375, E2 -0.125, E3 -0.625, E4 0.375, E5 -0.5, E6 0.5.
    # Discounted returns (Eq. 5, gamma 0.5): E1 [0 + 0.5 * 1, 1] = [0.5, 1]; E2 [0 + 0.5 * 0.5, 0.5 + 0.5 * 0, 0]
    #   = [0.25, 0.5, 0]; E3 [0, 0]; E4 [1]; E5 [0, 0]; E6 [0.5, 1].
    # Step groups (Eq. 6, 7):
    #   (0, P): E1 0.5, E2 0.25, E3 0, E4 1; mean 1.75 / 4 = 0.4375 -> 0.0625, -0.1875, -0.4375, 0.5625
    #   (0, X): E1 1, E2 0.5; mean 0.75 -> 0.25, -0.25
    #   (0, Y), (0, Z): one turn each -> 0
    #   (1, Q): E5 0, E6 0.5; mean 0.25 -> -0.25, 0.25
    #   (1, X): E5 0, E6 1; mean 0.5 -> -0.5, 0.5 (with group 0's X it would be mean 0.625)
    # A = A^E + 1 * A^S (Eq. 8):
    assert gigpo(MIXED, params()) == [
        [0.375 + 0.0625, 0.375 + 0.25],
        [-0.125 - 0.1875, -0.125 - 0.25, -0.125 + 0.0],
        [-0.625 - 0.4375, -0.625 + 0.0],
        [0.375 + 0.5625],
        [-0.5 - 0.25, -0.5 - 0.5],
        [0.5 + 0.25, 0.5 + 0.5],
    ]
    assert sorted(step_group_sizes(MIXED)) == [1, 1, 2, 2, 2, 4]  # Y, Z; (0, X), (1, Q), (1, X); (0, P)


def test_gigpo_with_batch_step_groups_by_hand():
    # As above, but the step groups span the batch: only the anchor X recurs across groups.
    #   X: E1 1, E2 0.5 (group 0), E5 0, E6 1 (group 1); mean 2.5 / 4 = 0.625 -> 0.375, -0.125, -0.625, 0.375
    #   P, Q, Y, Z: as within a group (no other group has them). A^E is unchanged (episode groups stay).
    assert gigpo(MIXED, params(step_groups="batch")) == [
        [0.375 + 0.0625, 0.375 + 0.375],
        [-0.125 - 0.1875, -0.125 - 0.125, -0.125 + 0.0],
        [-0.625 - 0.4375, -0.625 + 0.0],
        [0.375 + 0.5625],
        [-0.5 - 0.25, -0.5 - 0.625],
        [0.5 + 0.25, 0.5 + 0.375],
    ]
    assert sorted(step_group_sizes(MIXED, "batch")) == [1, 1, 2, 4, 4]  # Y, Z; Q; P, X


def test_batch_step_groups_join_groups_that_share_a_prompt():
    # Two groups of one prompt P (rows differing in a hidden state): group 1 found nothing, so its A^E is 0, and
    # its turns still learn from how the batch fared from the same contexts.
    # Returns (gamma 0.5): E1 [0.5, 1], E2 [0, 0], E3 [0, 0], E4 [0, 0].
    #   P: {0.5, 0, 0, 0}, mean 0.125 -> 0.375, -0.125, -0.125, -0.125;  A: E1 1, E3 0 -> 0.5, -0.5;  B, C: 0.
    #   A^E: group 0 {1, 0} -> 0.5, -0.5; group 1 {0, 0} -> 0, 0.
    games = [episode(0, "PA", 1.0), episode(0, "PB", 0.0), episode(1, "PA", 0.0), episode(1, "PC", 0.0)]
    assert gigpo(games, params(step_groups="batch")) == [[0.875, 1.0], [-0.625, -0.5], [-0.125, -0.5], [-0.125, 0.0]]
    # Within groups: P of group 0 {0.5, 0} -> 0.25, -0.25; group 1's turns all alike or alone -> 0.
    assert gigpo(games, params()) == [[0.75, 0.5], [-0.75, -0.5], [0.0, 0.0], [0.0, 0.0]]


def test_gigpo_step_weight_scales_only_the_step_advantage():
    # omega = 0.25: E2's second turn: A^E -0.125 + 0.25 * A^S -0.25 = -0.1875; E4: 0.375 + 0.25 * 0.5625 = 0.515625
    advantages = gigpo(MIXED, params(step_weight=0.25))
    assert advantages[1][1] == -0.1875
    assert advantages[3] == [0.515625]
    assert gigpo(MIXED, params(step_weight=0.0)) == grpo(MIXED, params())


def test_gigpo_without_the_first_turns_step_advantage_by_hand():
    # As test_gigpo_by_hand... with the step groups of the prompts (0, P) and (1, Q) dropped: first turns get A^E
    # alone, later turns A^E + A^S as before (their step groups are unchanged).
    assert gigpo(MIXED, params(step_first_turn=False)) == [
        [0.375, 0.375 + 0.25],
        [-0.125, -0.125 - 0.25, -0.125 + 0.0],
        [-0.625, -0.625 + 0.0],
        [0.375],
        [-0.5, -0.5 - 0.5],
        [0.5, 0.5 + 0.5],
    ]
    # Batch step groups, gamma 0 (each turn's step return its own reward): X pools E1 1, E2 0.5, E5 0, E6 1 ->
    # 0.375, -0.125, -0.625, 0.375 as in the batch test; Y, Z alone -> 0.
    assert gigpo(MIXED, params(gamma=0.0, step_groups="batch", step_first_turn=False)) == [
        [0.375, 0.375 + 0.375],
        [-0.125, -0.125 - 0.125, -0.125 + 0.0],
        [-0.625, -0.625 + 0.0],
        [0.375],
        [-0.5, -0.5 - 0.625],
        [0.5, 0.5 + 0.375],
    ]


def test_turn_returns_by_hand_baselined_per_turn_index():
    # Same discounted returns as above; baselines per (group, turn index) over the trajectories that reached it:
    #   (0, 1): E1 0.5, E2 0.25, E3 0, E4 1; mean 0.4375 -> 0.0625, -0.1875, -0.4375, 0.5625
    #   (0, 2): E1 1, E2 0.5, E3 0; mean 0.5 -> 0.5, 0, -0.5 (E4 stopped: not in it)
    #   (0, 3): E2 0 alone -> 0
    #   (1, 1): E5 0, E6 0.5 -> -0.25, 0.25;  (1, 2): E5 0, E6 1 -> -0.5, 0.5
    assert turn_returns(MIXED, params()) == [
        [0.0625, 0.5],
        [-0.1875, 0.0, 0.0],
        [-0.4375, -0.5],
        [0.5625],
        [-0.25, -0.5],
        [0.25, 0.5],
    ]


def test_std_modes_divide_by_the_sets_std():
    # Two trajectories, both turns from shared contexts; outcome 1 and 0, gamma 1, omega 0.5.
    # Every set (the group; step groups P and X; turn indices 1 and 2) holds the values {1, 0}: centred +-0.5.
    # population std 0.5 -> +-0.5 / 0.5 = +-1; sample std sqrt((0.25 + 0.25) / 1) = sqrt(0.5) -> +-sqrt(0.5).
    episodes = [episode(0, "PX", 1.0), episode(0, "PX", 0.0)]
    for std, unit in [("population", 1.0), ("sample", math.sqrt(0.5)), ("none", 0.5)]:
        p = params(std=std, gamma=1.0, step_weight=0.5)
        assert close(grpo(episodes, p), [[unit, unit], [-unit, -unit]], rel=1e-5)
        assert close(gigpo(episodes, p), [[1.5 * unit] * 2, [-1.5 * unit] * 2], rel=1e-5)
        assert close(turn_returns(episodes, p), [[unit, unit], [-unit, -unit]], rel=1e-5)


def test_a_singleton_group_gets_zero_advantage_everywhere():
    # Every set holds one value: each advantage is that value minus itself.
    alone = [episode(3, "PXY", 1.0, [0.5, 0.0, 0.25])]
    for name, estimator in GROUP_RELATIVE.items():
        for std in ("sample", "population", "none"):
            assert estimator(alone, params(std=std)) == [[0.0, 0.0, 0.0]], (name, std)


def test_a_group_of_equal_returns():
    # Outcome only, gamma 1: every set holds equal values, so every estimator gives 0 everywhere.
    flat = [episode(0, "PA", 1.0), episode(0, "PB", 1.0), episode(0, "P", 1.0)]
    for name, estimator in ESTIMATORS.items():
        assert estimator(flat, params(std="sample", gamma=1.0)) == [[0.0, 0.0], [0.0, 0.0], [0.0]], name
    # Equal returns R(tau) = 1, reached at different turns: E1 earns its reward on turn 1, E2 on turn 2.
    # grpo: 0. Discounted (gamma 0.5): E1 [1 + 0.5 * 0, 0] = [1, 0]; E2 [0 + 0.5 * 1, 1] = [0.5, 1].
    # gigpo: A^E 0; step group P: {1, 0.5}, mean 0.75 -> 0.25, -0.25; A and B: alone -> 0.
    # turn_returns: index 1 as P; index 2: {0, 1}, mean 0.5 -> -0.5, 0.5.
    timed = [episode(0, "PA", 0.0, [1.0, 0.0]), episode(0, "PB", 0.0, [0.0, 1.0])]
    assert grpo(timed, params()) == [[0.0, 0.0], [0.0, 0.0]]
    assert gigpo(timed, params()) == [[0.25, 0.0], [-0.25, 0.0]]
    assert turn_returns(timed, params()) == [[0.25, -0.5], [-0.25, 0.5]]


SINGLE_TURN = [  # three groups of one-turn trajectories, rewards that no normaliser divides evenly
    *(episode(0, "P", r) for r in (1.0, 0.0, 0.3, 1.0)),
    *(episode(1, "Q", r) for r in (0.7, 0.7)),
    episode(2, "R", 0.2, [0.1]),  # a singleton with a turn reward
    *(episode(4, "S", r, [t]) for r, t in ((1.0, -0.2), (0.0, 0.4), (0.5, 0.0))),
]


@pytest.mark.parametrize("std", ["sample", "population", "none"])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_on_single_turn_tasks_turn_returns_is_grpo_and_gigpo_is_one_plus_omega_grpo(std, gamma):
    # One turn: R_1 = gamma^0 * r_1 = R(tau), and turn index 1 is the whole group: turn_returns is grpo, exactly.
    # GiGPO: the one turn's context is the group's prompt, so its step group is the whole group and A^S = A^E:
    # A = (1 + omega) * A^E. It reduces to grpo only at omega = 0 (Eq. 8 has no other way to drop A^S).
    expected = grpo(SINGLE_TURN, params(std, gamma))
    rewards = torch.tensor([e.total_return for e in SINGLE_TURN], dtype=torch.float64)
    groups = torch.tensor([e.group for e in SINGLE_TURN])
    assert expected == [[a] for a in grpo_advantages(rewards, groups, std=std).advantages.tolist()]
    assert turn_returns(SINGLE_TURN, params(std, gamma)) == expected
    assert gigpo(SINGLE_TURN, params(std, gamma, step_weight=0.0)) == expected
    assert gigpo(SINGLE_TURN, params(std, gamma, step_weight=1.0)) == [[2 * a] for [a] in expected]
    assert close(gigpo(SINGLE_TURN, params(std, gamma, step_weight=0.3)), [[1.3 * a] for [a] in expected])
    # Without the first turn's step advantage (the prompt's step group), gigpo is grpo at any omega.
    assert gigpo(SINGLE_TURN, params(std, gamma, step_weight=0.3, step_first_turn=False)) == expected


def valued(group: int, outcome: float, values: list[float], rewards: list[float] | None = None) -> Episode:
    """An episode whose turns the critic valued ``values`` (anchors do not matter to gae)."""
    rewards = rewards or [0.0] * len(values)
    return Episode(group, tuple(Turn(str(t), r, v) for t, (r, v) in enumerate(zip(rewards, values))), outcome)


def test_lambda_returns_by_hand():
    # Rewards [0, 0, 1], values [0.2, 0.4, 0.5], gamma 1, lambda 0.5, backwards from G_4 = V_4 = 0:
    # G_3 = 1; G_2 = 0 + (0.5 * 0.5 + 0.5 * 1) = 0.75; G_1 = 0 + (0.5 * 0.4 + 0.5 * 0.75) = 0.575.
    assert lambda_returns([0.0, 0.0, 1.0], [0.2, 0.4, 0.5], 1.0, 0.5) == pytest.approx([0.575, 0.75, 1.0])
    # The same as GAE's sum of TD residuals: delta = [0.4 - 0.2, 0.5 - 0.4, 1 - 0.5] = [0.2, 0.1, 0.5];
    # A_3 = 0.5, A_2 = 0.1 + 0.5 * 0.5 = 0.35, A_1 = 0.2 + 0.5 * 0.35 = 0.375 = G - V.
    # lambda 1: the discounted return whatever V; lambda 0: r_t + gamma V_{t+1}.
    assert lambda_returns([0.0, 0.5, 1.0], [9.0, 9.0, 9.0], 0.5, 1.0) == discounted_returns([0.0, 0.5, 1.0], 0.5)
    assert lambda_returns([0.0, 0.5, 1.0], [0.2, 0.4, 0.5], 0.5, 0.0) == [0.0 + 0.5 * 0.4, 0.5 + 0.5 * 0.5, 1.0]


def test_gae_by_hand_whitened_over_the_batch():
    # E1: outcome 1 after three turns valued [0.2, 0.4, 0.5]: A = G - V = [0.375, 0.35, 0.5] (above, lambda 0.5);
    # E2: one turn valued 0.3, outcome 0: A = -0.3. std none: centred on the mean of all four turns, 0.23125.
    batch = [valued(0, 1.0, [0.2, 0.4, 0.5]), valued(1, 0.0, [0.3])]
    expected = [[0.14375, 0.11875, 0.26875], [-0.53125]]
    assert close(gae(batch, params(gamma=1.0, lam=0.5)), expected)
    # A group of one gets the critic's comparison, not 0: gae is not group-relative.
    assert close(gae(batch[1:], params(gamma=1.0, lam=0.5)), [[0.0]])
    assert close(
        gae(batch[:1], params(gamma=1.0, lam=0.5)), [[0.375 - 0.40833333, 0.35 - 0.40833333, 0.5 - 0.40833333]]
    )
    # sample std: divided by the std of the four raw advantages (+ 1e-6).
    raw = torch.tensor([0.375, 0.35, 0.5, -0.3], dtype=torch.float64)
    unit = ((raw - raw.mean()) / (raw.std() + 1e-6)).tolist()
    assert close(gae(batch, params("sample", gamma=1.0, lam=0.5)), [unit[:3], unit[3:]])


def test_gae_with_a_turn_reward_and_lambda_zero_credits_each_turn_by_its_successors_value():
    # Turn rewards [0.5, 0] and outcome 1: rewards [0.5, 1]; values [0.25, 0.75]; gamma 0.5, lambda 0:
    # A_1 = 0.5 + 0.5 * 0.75 - 0.25 = 0.625; A_2 = 1 - 0.75 = 0.25. A second episode with A = [0.0] centres them.
    batch = [valued(0, 1.0, [0.25, 0.75], [0.5, 0.0]), valued(0, 0.5, [0.5])]
    mean = (0.625 + 0.25 + 0.0) / 3
    assert close(gae(batch, params(gamma=0.5, lam=0.0)), [[0.625 - mean, 0.25 - mean], [0.0 - mean]])


def test_first_turns_of_outcome_only_games_get_grpos_advantage_from_turn_returns():
    # gamma 1 and no turn rewards: R_1 = outcome for every trajectory, and index 1 holds the whole group.
    games = [episode(0, "PAB", 1.0), episode(0, "PC", 0.0), episode(0, "P", 1.0), episode(0, "PDE", 0.0)]
    first = [a[0] for a in turn_returns(games, params("sample", gamma=1.0))]
    assert first == [a[0] for a in grpo(games, params("sample"))]


def test_registry_and_empty_batch():
    assert set(ESTIMATORS) == {"grpo", "gigpo", "turn_returns", "gae"}
    for estimator in ESTIMATORS.values():
        assert estimator([], params()) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"std": "mad", "gamma": 1.0, "step_weight": 1.0}, "std must be one of"),
        ({"std": "none", "gamma": 1.5, "step_weight": 1.0}, "gamma must be in"),
        ({"std": "none", "gamma": -0.1, "step_weight": 1.0}, "gamma must be in"),
        ({"std": "none", "gamma": 1.0, "step_weight": -1.0}, "step_weight"),
        ({"std": "none", "gamma": 1.0, "step_weight": math.inf}, "step_weight"),
        ({"std": "none", "gamma": 1.0, "step_weight": 1.0, "step_groups": "prompt"}, "step_groups must be one of"),
        ({"std": "none", "gamma": 1.0, "step_weight": 1.0, "lam": 1.5}, "GAE's lambda"),
    ],
)
def test_bad_params_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdvantageParams(**kwargs)


def test_bad_episodes_are_refused():
    with pytest.raises(ValueError, match="group 2 has no model turns"):
        Episode(2, (), 1.0)
    with pytest.raises(ValueError, match=r"non-finite rewards: \{'turn 1 reward': nan\}"):
        episode(0, "PX", 1.0, [0.0, math.nan])
    with pytest.raises(ValueError, match="outcome"):
        episode(0, "P", math.inf)
    with pytest.raises(ValueError, match=r"non-finite values \(its critic's\): \{'turn 0 value': nan\}"):
        valued(0, 1.0, [math.nan])


def test_turn_spans_on_hand_masks():
    # prompt of 3, a turn of 2, a tool reply of 2, a turn of 1, a closing token, a final turn ending the sequence
    assert turn_spans([0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1], 3) == [(3, 5), (7, 8), (9, 11)]
    assert turn_spans([0, 0], 2) == []
    with pytest.raises(ValueError, match="a 1 inside the prompt"):
        turn_spans([0, 1, 1], 2)
    with pytest.raises(ValueError, match=r"loss_mask\[2\] is 2"):
        turn_spans([0, 0, 2], 1)
    with pytest.raises(ValueError, match="outside the loss_mask"):
        turn_spans([0, 1], 3)


def test_turn_anchor_keys_the_exact_prefix():
    ids = [5, 6, 7, 8]
    assert turn_anchor(ids, 2) == turn_anchor([5, 6, 9], 2)
    assert turn_anchor(ids, 2) != turn_anchor(ids, 3)
    assert turn_anchor([1, 256], 2) != turn_anchor([256, 1], 2)  # position matters, not the multiset
    assert turn_anchor([0], 1) != turn_anchor([], 0)  # a token 0 is not an empty context
    assert len(turn_anchor(ids, 4)) == 16
    with pytest.raises(ValueError, match="outside the 4 token ids"):
        turn_anchor(ids, 5)
    with pytest.raises(ValueError, match="at most 64 bits"):
        turn_anchor([2**64], 1)


IMAGE = 9  # the placeholder token id; merge 2: an image of t x h x w patches has t * h * w / 4 placeholders
TWO_IMAGES = {
    "image_grid_thw": [[1, 2, 2], [1, 4, 2]],  # 4 patch rows (1 placeholder), then 8 (2 placeholders)
    "pixel_values": torch.arange(12 * 3, dtype=torch.float32).reshape(12, 3),
}


def test_context_images_are_the_images_whose_placeholders_the_prefix_holds():
    ids = [1, IMAGE, 2, IMAGE, IMAGE, 3]  # prompt, image 1, a turn (2), a tool's image 2, a turn (3)
    grids = torch.tensor(TWO_IMAGES["image_grid_thw"])
    pixels = TWO_IMAGES["pixel_values"]
    assert context_images(ids, 1, TWO_IMAGES, (IMAGE, 2)) == b""
    assert context_images(ids, 2, TWO_IMAGES, (IMAGE, 2)) == grids[:1].numpy().tobytes() + pixels[:4].numpy().tobytes()
    assert context_images(ids, 5, TWO_IMAGES, (IMAGE, 2)) == grids.numpy().tobytes() + pixels.numpy().tobytes()
    with pytest.raises(ValueError, match=r"holds 2 image placeholders \(id 9\), which is no whole number"):
        context_images(ids, 4, TWO_IMAGES, (IMAGE, 2))  # inside image 2's placeholders: no turn starts there
    # The same tokens with other pixels in the second image: the first turn's context is unchanged, the second's not.
    other = {**TWO_IMAGES, "pixel_values": torch.cat([pixels[:4], pixels[4:] + 1])}
    assert turn_anchor(ids, 2, context_images(ids, 2, other, (IMAGE, 2))) == turn_anchor(
        ids, 2, context_images(ids, 2, TWO_IMAGES, (IMAGE, 2))
    )
    assert turn_anchor(ids, 5, context_images(ids, 5, other, (IMAGE, 2))) != turn_anchor(
        ids, 5, context_images(ids, 5, TWO_IMAGES, (IMAGE, 2))
    )
    bf16 = {**TWO_IMAGES, "pixel_values": pixels.bfloat16()}  # bytes of any dtype
    assert len(context_images(ids, 2, bf16, (IMAGE, 2))) == 3 * 8 + 4 * 3 * 2


SECRET = 7
GAMES = [["5", "8", "7"], ["5", "2", "1"], ["4", "6", "9"], ["5", "7"], ["7"]]
"""Found on turn 3; lost; lost; found on turn 2; found on turn 1. Games 1, 2 and 4 all open with 5 ("higher")."""


async def play(engine_factory, guesses: list[str]):
    engine = engine_factory(list(guesses))
    agent = GuessDigitAgentGraph("guess_digit", {"max_guesses": 3}, engine, engine.tokenizer)
    out = await agent.run(
        [{"role": "user", "content": "guess"}], {"max_new_tokens": 2, "temperature": 1.0}, secret=SECRET
    )
    return out, engine.tokenizer


async def test_turns_and_anchors_of_real_games_and_gigpo_over_them(scripted_engine_factory):
    played = [await play(scripted_engine_factory, g) for g in GAMES]
    spans = [turn_spans(out.loss_mask, len(out.prompt_ids)) for out, _ in played]
    for (out, tokenizer), game, game_spans in zip(played, GAMES, spans):
        assert len(game_spans) == len(game)
        for (start, end), guess in zip(game_spans, game):  # each span is the model's reply: the guess and eos
            assert tokenizer.decode(out.all_token_ids[start:end], skip_special_tokens=True).strip() == guess
        for (_, end), (start, _) in pairwise(game_spans):  # between turns: the environment's answer
            answer = tokenizer.decode(out.all_token_ids[end:start])
            assert "higher" in answer or "lower" in answer
    anchors = [
        [turn_anchor(out.all_token_ids, s) for s, _ in game_spans] for (out, _), game_spans in zip(played, spans)
    ]
    contexts = [[out.all_token_ids[:s] for s, _ in game_spans] for (out, _), game_spans in zip(played, spans)]
    flat = [(a, c) for game_a, game_c in zip(anchors, contexts) for a, c in zip(game_a, game_c)]
    for a, c in flat:  # equal keys exactly for equal contexts
        for b, d in flat:
            assert (a == b) == (c == d)
    assert len({game[0] for game in anchors}) == 1  # every first turn: the prompt
    assert anchors[0][1] == anchors[1][1] == anchors[3][1] != anchors[2][1]  # "5" then "higher" vs "4"
    assert anchors[0][2] != anchors[1][2]

    episodes = [
        Episode(0, tuple(Turn(a) for a in game_anchors), out.reward_score)
        for (out, _), game_anchors in zip(played, anchors)
    ]
    assert [e.outcome for e in episodes] == [1.0, 0.0, 0.0, 1.0, 1.0]
    # A^E: returns 1, 0, 0, 1, 1, mean 0.6 -> 0.4, -0.6, -0.6, 0.4, 0.4
    # Discounted (gamma 0.5): G1 [0.25, 0.5, 1]; G2 [0, 0, 0]; G3 [0, 0, 0]; G4 [0.5, 1]; G5 [1]
    # Step group of the prompt: 0.25, 0, 0, 0.5, 1; mean 0.35 -> -0.1, -0.35, -0.35, 0.15, 0.65
    # Step group "5, higher" (turn 2 of G1, G2, G4): 0.5, 0, 1; mean 0.5 -> 0, -0.5, 0.5; all others alone -> 0
    assert close(
        gigpo(episodes, params()),
        [[0.4 - 0.1, 0.4 + 0.0, 0.4], [-0.6 - 0.35, -0.6 - 0.5, -0.6], [-0.6 - 0.35, -0.6, -0.6], [0.55, 0.9], [1.05]],
    )
    assert sorted(step_group_sizes(episodes)) == [1, 1, 1, 1, 3, 5]
