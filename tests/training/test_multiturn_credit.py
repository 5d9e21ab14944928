"""Credit reaches every model turn of a multi-turn trajectory, packed or not.

Real ``guess_digit`` games (the engine scripts the guesses, the real tiny model scores them) go through the
trainer's own path: advantages, micro-batch planning, collation and ``GRPOModule``'s loss. The gradient of that
loss with respect to each generated token's log-prob must be non-zero on turn 2 and turn 3 too, point the way
of the trajectory's advantage (descending the loss raises the log-probs of a winning game's guesses), and be
zero on the prompt and on the environment's turns.
"""

from __future__ import annotations

import pytest
import torch

import lit_agentrl.training.module as module_file
import lit_agentrl.training.objective as objective_file
from lit_agentrl.agents.guess_digit import GuessDigitAgentGraph
from lit_agentrl.config.training import Compute
from lit_agentrl.training.batching import TrainingSample, collate, plan_micro_batches, prepare_samples
from lit_agentrl.training.module import GRPOModule
from lit_agentrl.training.objective import micro_batch_loss
from lit_agentrl.types import Trajectory

SECRET = 7
GAMES = [["5", "8", "7"], ["5", "2", "1"], ["4", "6", "9"], ["5", "7"], ["7"]]
"""Guesses per game: found on turn 3, lost, lost, found on turn 2, found on turn 1 (the last two pack in one row)."""


async def play(engine_factory, guesses: list[str], sample: int) -> Trajectory:
    engine = engine_factory(list(guesses))
    agent = GuessDigitAgentGraph("guess_digit", {"max_guesses": 3}, engine, engine.tokenizer)
    out = await agent.run(
        [{"role": "user", "content": "guess"}], {"max_new_tokens": 2, "temperature": 1.0}, secret=SECRET
    )
    assert out.extra_fields["guesses"] == [int(g) for g in guesses]
    return Trajectory(
        group=0,
        sample=sample,
        agent_name="guess_digit",
        prompt_ids=out.prompt_ids,
        all_token_ids=out.all_token_ids,
        loss_mask=out.loss_mask,
        response_logprobs=out.response_logprobs,
        reward=out.reward_score,
    )


def turns(loss_mask: list[int]) -> list[list[int]]:
    """Positions of each model turn: the runs of 1s in the mask."""
    runs: list[list[int]] = []
    for i, (before, here) in enumerate(zip([0, *loss_mask], loss_mask)):
        if here and not before:
            runs.append([])
        if here:
            runs[-1].append(i)
    return runs


def logprob_grads(module: GRPOModule, samples: list[TrainingSample], plans, monkeypatch) -> list[torch.Tensor]:
    """d loss / d log-prob of every token of every sample, through the module's own micro-batch loss."""
    seen: list[torch.Tensor] = []

    def spy(loss, correction, micro, policy, *args, **kwargs):
        policy.logprobs.retain_grad()
        seen.append(policy.logprobs)
        return micro_batch_loss(loss, correction, micro, policy, *args, **kwargs)

    monkeypatch.setattr(module_file, "micro_batch_loss", spy)
    scale = objective_file.loss_scale(samples)
    grads: dict[int, torch.Tensor] = {}
    for plan in plans:
        order = [i for row in plan for i in row]
        micro = collate([[samples[i] for i in row] for row in plan], module.model.config.pad_token_id)
        loss, _ = module._micro_loss(micro, scale, temperature=1.0)
        loss.backward()
        for k, index in enumerate(order):  # sequence k of the micro-batch is samples[index], tokens in order
            grads[index] = seen[-1].grad[micro.sequence_index == k]
    return [grads[i] for i in range(len(samples))]


@pytest.mark.parametrize("packing", [True, False])
async def test_turn_2_and_3_tokens_get_gradient_with_the_advantage_sign(
    packing, tiny_model_dir, scripted_engine_factory, monkeypatch
):
    trajectories = [await play(scripted_engine_factory, g, i) for i, g in enumerate(GAMES)]
    assert [t.reward for t in trajectories] == [1.0, 0.0, 0.0, 1.0, 1.0]
    prepared = prepare_samples(trajectories)
    module = GRPOModule(str(tiny_model_dir), compute=Compute(sequence_packing=packing))
    module.configure_model()
    plans = plan_micro_batches(prepared.samples, token_budget=10_000, packing=packing)
    if packing:
        assert any(len(row) > 1 for plan in plans for row in plan), "packing should put several games in one row"

    for sample, games, grad in zip(
        prepared.samples, GAMES, logprob_grads(module, prepared.samples, plans, monkeypatch)
    ):
        per_turn = turns(sample.loss_mask)
        assert len(per_turn) == len(games)
        for turn, positions in enumerate(per_turn, start=1):
            ascent = -grad[positions]
            assert (ascent != 0).all(), f"turn {turn} of a game with advantage {sample.advantage:+.2f} got no gradient"
            assert (torch.sign(ascent) == torch.sign(torch.tensor(sample.advantage))).all(), f"turn {turn}: wrong sign"
        outside = [i for i, m in enumerate(sample.loss_mask) if not m]
        assert (grad[outside] == 0).all(), "the prompt and the environment's turns must get no gradient"
