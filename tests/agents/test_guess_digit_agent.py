"""The multi-turn quickstart's agent: feedback, stopping, reward, per-turn metrics, token-exact turns."""

from __future__ import annotations

import pytest

from lit_agentrl.agents.guess_digit import (
    GuessDigitAgentGraph,
    feedback,
    game_reward,
    narrowing_score,
    turn_credits,
)
from lit_agentrl.rollout.manager import check_output
from lit_agentrl.rollout.metrics import agent_metrics
from lit_agentrl.types import Trajectory

PROMPT = [{"role": "user", "content": "guess"}]
PARAMS = {"max_new_tokens": 2, "temperature": 1.0}


def agent_for(
    engine, max_guesses: int = 3, feedback_credit: float = 0.0, turn_credit: bool = False
) -> GuessDigitAgentGraph:
    cfg = {"max_guesses": max_guesses, "feedback_credit": feedback_credit, "turn_credit": turn_credit}
    return GuessDigitAgentGraph("guess_digit", cfg, engine, engine.tokenizer)


def test_feedback_points_to_the_secret():
    assert [feedback(g, 6) for g in (2, 9, 6, None)] == ["higher", "lower", "found", "?"]


async def test_the_environment_answers_each_guess_as_a_user_turn(scripted_engine_factory, tokenizer):
    engine = scripted_engine_factory(["2", "x", "6"])
    out = await agent_for(engine).run(PROMPT, PARAMS, secret=6)
    check_output(out)
    assert out.extra_fields["guesses"] == [2, None, 6]
    assert out.reward_score == 1.0
    assert out.extra_fields["metrics"] == {"found_turn_1": 0.0, "found_turn_2": 0.0, "found_turn_3": 1.0}
    # The second and third requests carry the environment's answers, as the chat template renders user turns.
    assert "<|im_start|>user\nhigher<|im_end|>" in tokenizer.decode(engine.calls[1])
    assert "<|im_start|>user\n?<|im_end|>" in tokenizer.decode(engine.calls[2])
    generated = [t for t, m in zip(out.all_token_ids, out.loss_mask) if m]
    assert tokenizer.decode(generated) == "2<|im_end|>x<|im_end|>6<|im_end|>"


async def test_the_game_ends_when_found_or_after_max_guesses(scripted_engine_factory):
    found = await agent_for(scripted_engine_factory(["4"])).run(PROMPT, PARAMS, secret=4)
    assert found.extra_fields["guesses"] == [4] and found.reward_score == 1.0
    assert found.extra_fields["metrics"] == {"found_turn_1": 1.0}
    lost = await agent_for(scripted_engine_factory(["1", "2"]), max_guesses=2).run(PROMPT, PARAMS, secret=9)
    assert lost.extra_fields["guesses"] == [1, 2] and lost.reward_score == 0.0
    assert lost.extra_fields["metrics"] == {"found_turn_1": 0.0, "found_turn_2": 0.0}


@pytest.mark.parametrize("secret", [None, 10, "3", 2.5])
async def test_a_row_without_a_digit_secret_is_refused_naming_the_field(scripted_engine_factory, secret):
    with pytest.raises(ValueError, match="row field 'secret' must be a digit 0-9"):
        await agent_for(scripted_engine_factory(["1"])).run(PROMPT, PARAMS, secret=secret)


@pytest.mark.parametrize(
    "guesses, score",
    [
        ([5, 7, 6], 0.6 + 0.9),
        ([5, 2, 8], 0.6),
        ([5, None, 9], 0.6),
        ([5, 3], 0.0),
        ([6], 0.0),
        ([None, 3, 8], 0.4),
        ([None, None, 8], 0.0),
        ([0, 9, 6], 0.1 + 0.2),
    ],
)
def test_narrowing_score_pays_for_guesses_inside_a_range_the_answers_narrowed(guesses, score):
    assert narrowing_score(guesses, secret=6) == pytest.approx(score)


def test_feedback_credit_adds_to_the_found_reward():
    assert game_reward([5, 7, 6], 6) == 1.0
    assert game_reward([5, 7, 6], 6, feedback_credit=0.2) == pytest.approx(1.3)
    assert game_reward([4, 7, 5], 6, feedback_credit=0.2) == pytest.approx(0.2 * (0.5 + 0.8))
    # However many guesses, a game that never finds the digit stays below the 1.0 that val/accuracy counts.
    assert game_reward([4, 7, 5, 5, 5, 5, 5], 6, feedback_credit=0.9) == pytest.approx(0.9)


async def test_the_agent_scores_with_its_feedback_credit(scripted_engine_factory):
    out = await agent_for(scripted_engine_factory(["4", "7", "5"]), feedback_credit=0.2).run(PROMPT, PARAMS, secret=6)
    assert out.reward_score == pytest.approx(0.2 * (0.5 + 0.8)) and out.turn_rewards is None


@pytest.mark.parametrize(
    "guesses, credit, expected",
    [
        # secret 6: 5 rules out 0-5 (range 6-9), 7 then 6-6; shares 0, 0.6, 0.9
        ([5, 7, 6], 0.2, [0.0, 0.12, 0.18]),
        # 4 leaves 5-9, 7 leaves 5-6; shares 0, 0.5, 0.8, then 5 is outside 6-6: the cap of 0.9 cuts the third turn
        ([4, 7, 5, 5], 0.9, [0.0, 0.45, 0.45, 0.0]),
        ([None, 3, 8], 0.5, [0.0, 0.0, 0.2]),  # no digit, then 3 leaves 4-9: 8 rules out 0.4
    ],
)
def test_turn_credits_split_the_shaped_reward_by_the_turn_that_earned_it(guesses, credit, expected):
    credits = turn_credits(guesses, 6, credit)
    assert credits == pytest.approx(expected)
    assert float(6 in guesses) + sum(credits) == pytest.approx(game_reward(guesses, 6, credit))


async def test_with_turn_credit_the_agent_reports_each_turns_share_as_its_turn_reward(scripted_engine_factory):
    agent = agent_for(scripted_engine_factory(["5", "7", "6"]), feedback_credit=0.2, turn_credit=True)
    out = await agent.run(PROMPT, PARAMS, secret=6)
    check_output(out)
    assert out.reward_score == 1.0 and out.turn_rewards == pytest.approx([0.0, 0.12, 0.18])


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"max_guesses": 0}, "max_guesses must be >= 1"),
        ({"feedback_credit": 1.5}, r"feedback_credit must be in \[0, 1\)"),
        ({"turn_credit": "yes"}, "turn_credit must be true or false, got 'yes'"),
    ],
)
def test_bad_agent_config_is_refused(scripted_engine_factory, cfg, message):
    engine = scripted_engine_factory([])
    with pytest.raises(ValueError, match=message):
        GuessDigitAgentGraph("guess_digit", cfg, engine, engine.tokenizer)


def test_agent_metrics_average_over_the_trajectories_that_report_them():
    def traj(metrics):
        return Trajectory(0, 0, "guess_digit", extra_fields={"metrics": metrics})

    logged = agent_metrics(
        [
            traj({"found_turn_1": 1.0}),
            traj({"found_turn_1": 0.0, "found_turn_2": 1.0}),
            traj({"found_turn_1": 0.0, "found_turn_2": 0.0}),
            Trajectory(0, 0, "other"),
        ]
    )
    assert logged == {"agent/guess_digit/found_turn_1": pytest.approx(1 / 3), "agent/guess_digit/found_turn_2": 0.5}


async def test_malformed_agent_metrics_fail_the_trajectory_with_the_reason(scripted_engine_factory):
    out = await agent_for(scripted_engine_factory(["4"])).run(PROMPT, PARAMS, secret=4)
    out.extra_fields["metrics"] = {"found": "yes"}
    with pytest.raises(ValueError, match=r"extra_fields\['metrics'\] must map metric names to finite numbers"):
        check_output(out)
