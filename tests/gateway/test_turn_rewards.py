"""Turn rewards from every kind of agent: an environment's step rewards, an OpenAI-client agent's rewards named by
reply, a LangGraph agent's ``AgentGraphOutput.turn_rewards``; each lands on its model turn, the trajectory's reward
is the outcome plus their sum, and a count that does not match the model turns fails the trajectory, named."""

from __future__ import annotations

import openai
import pytest
from gateway_support import ROW, rollout

from lit_agentrl.agents import AgentResult, Environment, register_environment, register_openai_agent
from lit_agentrl.agents.base import AgentGraph, AgentGraphOutput
from lit_agentrl.agents.registry import register
from lit_agentrl.training.batching import prepare_samples
from lit_agentrl.types import Trajectory


@register_environment("stepped_rewards_env")
class SteppedRewards(Environment):
    """Three steps: rewards 0.25, 0, 1."""

    def reset(self, row: dict) -> str:
        self.rewards = [0.25, 0.0, 1.0]
        return "go"

    def step(self, action: str) -> tuple[str, float, bool]:
        reward = self.rewards.pop(0)
        return "again", reward, not self.rewards


@register_openai_agent("turn_rewarded_client")
async def turn_rewarded(client: openai.AsyncOpenAI, row: dict, cfg) -> AgentResult:
    messages = list(row["messages"])
    replies = []
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        replies.append(reply)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    return AgentResult(reward=1.0, turn_rewards={replies[0].id: 0.5, f"{replies[2].id}/0": -0.25})


@register_openai_agent("turn_rewarded_unknown_reply")
async def unknown_reply(client: openai.AsyncOpenAI, row: dict, cfg) -> AgentResult:
    await client.chat.completions.create(model="policy", messages=list(row["messages"]))
    return AgentResult(reward=1.0, turn_rewards={"chatcmpl-nope": 1.0})


@register("turn_rewards_miscounted")
class Miscounted(AgentGraph):
    """A graph agent that gives two turn rewards for its one model turn."""

    def build_graph(self) -> None:
        self.chatmodel = self.make_chat_model()

    async def run(self, messages, sampling_params, **kwargs) -> AgentGraphOutput:
        if not hasattr(self, "chatmodel"):
            self.build_graph()
        reply = await self.chatmodel.ainvoke(list(messages), sampling_params=sampling_params)
        output = self.convert_agent_graph_output([*messages, reply])
        output.reward_score, output.turn_rewards = 0.0, [1.0, 2.0]
        return output


def model_turns(trajectory: Trajectory) -> int:
    mask = trajectory.loss_mask
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))


def test_an_environments_step_rewards_are_its_turn_rewards(scripted_engine_factory, tokenizer):
    engine = scripted_engine_factory(["a", "b", "c"])
    (t,) = rollout(engine, tokenizer, {**ROW, "agent_name": "stepped_rewards_env"}).trajectories
    assert not t.failed, t.failure_reason
    assert t.turn_rewards == [0.25, 0.0, 1.0] and t.reward == 1.25 and model_turns(t) == 3


def test_an_openai_client_names_its_turns_by_reply(scripted_engine_factory, tokenizer):
    engine = scripted_engine_factory(["a", "b", "c"])
    (t,) = rollout(engine, tokenizer, {**ROW, "agent_name": "turn_rewarded_client"}).trajectories
    assert not t.failed, t.failure_reason
    assert t.turn_rewards == [0.5, 0.0, -0.25] and t.reward == 1.25  # the outcome 1 and the turns' 0.25
    # turn_returns credits each turn its reward-to-go: with one trajectory per group every advantage is 0, so
    # compare the per-turn returns the estimator sees through a second trajectory of the group without them
    plain = Trajectory(**{**t.__dict__, "sample": 1, "turn_rewards": None, "reward": 1.0})
    prepared = prepare_samples([t, plain], "none", advantage="turn_returns", gamma=1.0)
    # returns: t 1.25, 0.75, 0.75 (0.5 + 0 - 0.25 + 1 = 1.25; then 0 - 0.25 + 1; then -0.25 + 1); plain 1, 1, 1
    assert t.turn_advantages == [0.125, -0.125, -0.125] and plain.turn_advantages == [-0.125, 0.125, 0.125]
    assert prepared.turn_metrics["train/turn_1/reward_mean"] == 0.25  # (0.5 + 0) / 2: the turns' own, per index
    assert (
        prepared.turn_metrics["train/turn_3/reward_mean"] == -0.125
        and "train/turn_4/reward_mean" not in prepared.turn_metrics
    )


def test_a_reply_the_trajectory_does_not_hold_fails_it_named(scripted_engine_factory, tokenizer):
    engine = scripted_engine_factory(["a"])
    (t,) = rollout(engine, tokenizer, {**ROW, "agent_name": "turn_rewarded_unknown_reply"}).trajectories
    assert t.failed and "turn_rewards names 'chatcmpl-nope', which is no reply of this trajectory" in t.failure_reason


def test_a_miscount_fails_the_trajectory_named(scripted_engine_factory, tokenizer):
    engine = scripted_engine_factory(["a"])
    (t,) = rollout(engine, tokenizer, {**ROW, "agent_name": "turn_rewards_miscounted"}).trajectories
    assert t.failed and "turn_rewards has 2 entries for 1 model turns" in t.failure_reason


@pytest.mark.parametrize("agent", ["guess_digit", "guess_digit_openai", "guess_digit_env"])
def test_the_quickstart_game_reports_its_shaped_credit_per_turn_in_all_three_forms(
    scripted_engine_factory, tokenizer, tmp_path, agent
):
    cfg = tmp_path / "game.yaml"
    cfg.write_text("feedback_credit: 0.2\nturn_credit: true\n")
    row = {
        "agent_name": agent,
        "agent_cfg_path": str(cfg),
        "prompt": [{"role": "user", "content": "guess"}],
        "secret": 6,
    }
    (t,) = rollout(scripted_engine_factory(["5", "7", "6"]), tokenizer, row).trajectories
    assert not t.failed, t.failure_reason
    # shares 0, 0.6, 0.9 of the digits ruled out (5 leaves 6-9, 7 leaves 6), times 0.2; the find's 1 on top, which
    # an environment pays with its last step (the estimators count the outcome in the last turn's reward alike)
    last = 1.18 if agent == "guess_digit_env" else 0.18
    assert t.turn_rewards == pytest.approx([0.0, 0.12, last]) and t.reward == pytest.approx(1.3)
