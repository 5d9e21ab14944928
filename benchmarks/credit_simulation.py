"""A fast simulation of the sparse guessing game for comparing credit rules, seconds a run: NOT the project's trainer.

The policy here is a two-layer MLP over one-hot features of the guesses and answers so far (not the tiny Qwen3 behind
``credit_per_turn.py``), trained by a plain policy gradient with Adam on 128 games a step (16 groups of 8); the game is
``guess_digit``'s with a sparse reward (1 when a guess finds the digit). It exists to ask one question cheaply before
building anything into the trainer: does a credit rule change how fast the game is learned? Rules:

- ``grpo``: every turn gets its game's group-normalised reward (the project's ``grpo``);
- ``grpo_whitened``: the same, whitened over the whole batch instead of per group (the critic's normalisation);
- ``gamma0``: each turn gets 1 if it found the digit, baselined per turn index within its group (``turn_returns``
  with ``gamma: 0``);
- ``critic``: a learned value V(s) (a second MLP, regressed on the lambda-returns) and GAE over turns (Schulman et al.
  2016, arXiv 1506.02438: delta_t = r_t + V(s_{t+1}) - V(s_t), A_t = sum_k lambda^k delta_{t+k}, gamma 1), advantages
  whitened over the batch; ``--lam 1`` makes V a baseline only, ``--lam 0`` pure bootstrapping.

    python benchmarks/credit_simulation.py --rules grpo gamma0 critic --seeds 0 1 2 3 4 --lr 3e-4

Each row: the reward and the success on turns 2 and 3 among the games that reached them (blind 0.1 each here, where
a blind guess may repeat), first fifth of the steps -> last fifth.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

GROUPS, PER_GROUP, TURNS, DIGITS = 16, 8, 3, 10
GAMES = GROUPS * PER_GROUP
FEATURES = TURNS + (TURNS - 1) * (DIGITS + 2)
"""The turn index, then for each earlier turn its guess (one of ten) and its answer (higher or lower)."""


def features(guesses: torch.Tensor, answers: torch.Tensor, turn: int) -> torch.Tensor:
    """One-hot state of each game before ``turn``: ``guesses``/``answers`` [GAMES, TURNS], -1 where none yet."""
    x = torch.zeros(GAMES, FEATURES)
    x[:, turn] = 1
    for k in range(TURNS - 1):
        offset = TURNS + k * (DIGITS + 2)
        for values, shift in ((guesses[:, k], 0), (answers[:, k], DIGITS)):
            seen = values >= 0
            x[seen, offset + shift + values[seen]] = 1
    return x


def mlp(outputs: int) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, outputs))


def play(policy: nn.Module) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """128 games: each turn's state features, the log-probs of its guesses, rewards [GAMES, TURNS] and which turns
    were reached [GAMES, TURNS]."""
    secret = torch.randint(DIGITS, (GAMES,))
    guesses = torch.full((GAMES, TURNS), -1)
    answers = torch.full((GAMES, TURNS), -1)
    playing = torch.ones(GAMES, dtype=torch.bool)
    states, logps, rewards, reached = [], [], torch.zeros(GAMES, TURNS), torch.zeros(GAMES, TURNS)
    for turn in range(TURNS):
        x = features(guesses, answers, turn)
        dist = torch.distributions.Categorical(logits=policy(x))
        guess = dist.sample()
        found = (guess == secret) & playing
        states.append(x)
        logps.append(dist.log_prob(guess))
        reached[:, turn] = playing.float()
        rewards[found, turn] = 1.0
        guesses[:, turn] = torch.where(playing, guess, guesses[:, turn])
        answers[:, turn] = torch.where(playing & ~found, (secret < guess).long(), answers[:, turn])
        playing &= ~found
    return states, torch.stack(logps, 1), rewards, reached


def grpo(rewards: torch.Tensor, reached: torch.Tensor) -> torch.Tensor:
    total = rewards.sum(1).view(GROUPS, PER_GROUP)
    advantage = (total - total.mean(1, keepdim=True)) / (total.std(1, keepdim=True) + 1e-6)
    return advantage.reshape(GAMES, 1).expand(GAMES, TURNS)


def grpo_whitened(rewards: torch.Tensor, reached: torch.Tensor) -> torch.Tensor:
    """The outcome advantage whitened over the whole batch, as the critic's advantages are: its control."""
    total = rewards.sum(1)
    return ((total - total.mean()) / (total.std() + 1e-6)).view(GAMES, 1).expand(GAMES, TURNS)


def gamma0(rewards: torch.Tensor, reached: torch.Tensor) -> torch.Tensor:
    """Each turn's own reward, centred and scaled over its group's games that reached that turn."""
    r, m = rewards.view(GROUPS, PER_GROUP, TURNS), reached.view(GROUPS, PER_GROUP, TURNS)
    n = m.sum(1, keepdim=True)
    mean = (r * m).sum(1, keepdim=True) / n.clamp(min=1)
    std = (((r - mean) ** 2 * m).sum(1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
    return (((r - mean) / (std + 1e-6)) * m * (n > 1)).view(GAMES, TURNS)


def gae(rewards: torch.Tensor, reached: torch.Tensor, values: torch.Tensor, lam: float) -> torch.Tensor:
    """GAE over turns with gamma 1: a turn not reached has no value, and the game ends after its last reached turn."""
    after = torch.cat([values[:, 1:] * reached[:, 1:], torch.zeros(GAMES, 1)], 1)
    delta = (rewards + after - values) * reached
    advantages, running = torch.zeros_like(delta), torch.zeros(GAMES)
    for turn in reversed(range(TURNS)):
        later = reached[:, turn + 1] if turn + 1 < TURNS else torch.zeros(GAMES)
        running = delta[:, turn] + lam * running * later
        advantages[:, turn] = running
    return advantages


OUTCOME_RULES = {"grpo": grpo, "grpo_whitened": grpo_whitened, "gamma0": gamma0}
RULES = [*OUTCOME_RULES, "critic"]


def train(rule: str, seed: int, steps: int, lr: float, lam: float) -> tuple[list[float], list[float]]:
    torch.manual_seed(seed)
    policy, critic = mlp(DIGITS), mlp(1)
    optimizer, critic_optimizer = torch.optim.Adam(policy.parameters(), lr), torch.optim.Adam(critic.parameters(), 1e-2)
    curves: list[list[float]] = [[], [], []]
    for _ in range(steps):
        states, logps, rewards, reached = play(policy)
        curves[0].append(rewards.sum(1).mean().item())
        for turn in (1, 2):
            curves[turn].append((rewards[:, turn].sum() / reached[:, turn].sum()).item())
        if rule == "critic":
            with torch.no_grad():
                values = torch.cat([critic(x) for x in states], 1)
                advantages = gae(rewards, reached, values, lam)
                targets = advantages + values
                on = reached.bool()
                advantages = (advantages - advantages[on].mean()) / (advantages[on].std() + 1e-6)
            for _ in range(2):
                predicted = torch.cat([critic(x) for x in states], 1)
                value_loss = ((predicted - targets) ** 2 * reached).sum() / reached.sum()
                critic_optimizer.zero_grad()
                value_loss.backward()
                critic_optimizer.step()
        else:
            advantages = OUTCOME_RULES[rule](rewards, reached)
        loss = -(logps * advantages * reached).sum() / reached.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    fifth = steps // 5
    return [statistics.fmean(c[:fifth]) for c in curves], [statistics.fmean(c[-fifth:]) for c in curves]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="+", default=["grpo", "gamma0", "critic"], choices=RULES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--lr", type=float, default=3e-4, help="the policy's Adam learning rate")
    parser.add_argument("--lam", type=float, default=0.5, help="GAE's lambda for the critic rule")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| rule | seed | reward | found on turn 2 | found on turn 3 |\n|---|---|---|---|---|")
    for rule in args.rules:
        gains = []
        for seed in args.seeds:
            first, last = train(rule, seed, args.steps, args.lr, args.lam)
            gains.append([b - a for a, b in zip(first, last)])
            print(f"| {rule} | {seed} | " + " | ".join(f"{a:.3f} -> {b:.3f}" for a, b in zip(first, last)) + " |")
        mean = [statistics.fmean(g[i] for g in gains) for i in range(3)]
        print(f"| **{rule}**, mean gain | | " + " | ".join(f"{m:+.3f}" for m in mean) + " |")


if __name__ == "__main__":
    main()
