"""How fast can a critic learn the sparse guessing game's values from the games a run plays? (issue 43): NOT the
trainer, a supervised regression on the trainer's own inputs.

The critic-based credit rules (``gae``, and the action-value critic tried on the ``q-critic-prototype`` branch) can only
beat ``grpo`` once their critic tells a good turn from a bad one. Under blind play (every guess uniform, where a
run starts) the value of a turn's context V(s) depends on its turn index alone (the next guess ignores the answers),
so only the action value Q(s, a) of a turn, read after its guess, carries the rule "a guess inside the range the
answers left is worth more". This script asks how many steps a critic needs to learn it, with everything in the
critic's favour: the true games of 128 blind plays a step (the trainer's batch), the exact chat-templated tokens the
tiny Qwen3 reads, the game's outcome as target, and no policy drifting under it.

Critics (``--critic``):

- ``model``: a separate critic model, as verl's PPO critic and ArCHer's are: the tiny Qwen3's architecture with its
  own weights, trained end to end with a value head (the project's ``ValueHead``) on the hidden state after each
  guess;
- ``head``: the project's ``gae`` critic as it is built, a ``ValueHead`` on the policy's detached final hidden states
  (here the random-init policy, frozen, as at the start of a run).

Each report line: the explained variance of the outcome by the critic's Q on 4096 held-out games (1 - Var(G - Q) /
Var(G)) against two references computed exactly: the turn index alone (what a critic learns first) and the true Q
under blind play (the most any critic can explain); and the gap between the critic's mean Q of a second guess
inside the range the first answer left and outside it (true gap under blind play 0.14; 0 for a critic that has
not learned to read).

    python benchmarks/critic_learnability.py --critic model --lr 1e-3 --updates 2
"""

from __future__ import annotations

import argparse
import random
from functools import cache

import torch
from transformers import PreTrainedTokenizerBase

from lit_agentrl.agents.guess_digit import FOUND, feedback
from lit_agentrl.models.tiny import TinyModelConfig, build_model, build_word_tokenizer
from lit_agentrl.training.critic import ValueHead

GAMES_PER_STEP, HELD_OUT, GUESSES, DIGITS = 128, 4096, 3, 10
MISS = (DIGITS - 1) / DIGITS
"""A blind guess misses a digit 9 times in 10."""


class Turn:
    """One guess of a blind game: the chat text up to and including it, its outcome and its exact blind Q."""

    def __init__(self, messages: list[dict[str, str]], guesses: list[int], secret: int, found: bool) -> None:
        self.messages = messages
        self.guesses = tuple(guesses)
        self.index = len(guesses) - 1
        self.outcome = float(found)
        answers = tuple(feedback(g, secret) for g in guesses[:-1])
        self.blind_q = blind_action_value(self.guesses, answers)
        left = consistent(guesses[:-1], answers)
        self.in_range = guesses[-1] in left if self.index == 1 else None


def consistent(guesses: tuple[int, ...] | list[int], answers: tuple[str, ...]) -> list[int]:
    """The digits the answers so far allow."""
    return [s for s in range(DIGITS) if all(feedback(g, s) == a for g, a in zip(guesses, answers))]


@cache
def blind_action_value(guesses: tuple[int, ...], answers: tuple[str, ...]) -> float:
    """P(the game is won) after the last of ``guesses``, before its answer, when later guesses are blind."""
    left = consistent(guesses[:-1], answers)
    later = GUESSES - len(guesses)
    return sum(1.0 if guesses[-1] == s else 1.0 - MISS**later for s in left) / len(left)


def blind_game(rng: random.Random) -> list[Turn]:
    """One game of uniform guesses over a uniform secret, as its turns."""
    secret = rng.randrange(DIGITS)
    messages = [{"role": "user", "content": "guess"}]
    guesses: list[int] = []
    while len(guesses) < GUESSES and secret not in guesses:
        if guesses:
            messages.append({"role": "user", "content": feedback(guesses[-1], secret)})
        guesses.append(rng.randrange(DIGITS))
        messages.append({"role": "assistant", "content": str(guesses[-1])})
    found = secret in guesses
    assert found == (feedback(guesses[-1], secret) == FOUND)
    return [Turn(messages[: 2 * k + 2], guesses[: k + 1], secret, found) for k in range(len(guesses))]


def blind_turns(rng: random.Random, games: int) -> list[Turn]:
    return [turn for _ in range(games) for turn in blind_game(rng)]


class Critic(torch.nn.Module):
    """Q of each turn: a value head on the trunk's final hidden state at the guess's end-of-turn token."""

    def __init__(self, trunk: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, trained_trunk: bool) -> None:
        super().__init__()
        self.trunk = trunk.requires_grad_(trained_trunk)
        self.tokenizer = tokenizer
        self.head = ValueHead(trunk.config.hidden_size)

    def forward(self, turns: list[Turn]) -> torch.Tensor:
        texts = [self.tokenizer.apply_chat_template(t.messages, tokenize=False) for t in turns]
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="right")
        hidden = self.trunk(**batch).last_hidden_state
        end_of_turn = batch["attention_mask"].sum(1) - 2  # the text ends "<|im_end|>\n": read at <|im_end|>
        return self.head(hidden[torch.arange(len(turns)), end_of_turn])


def explained(outcomes: torch.Tensor, estimate: torch.Tensor) -> float:
    """1 - Var(G - estimate) / Var(G)."""
    return 1.0 - float((outcomes - estimate).var() / outcomes.var())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--critic", choices=["model", "head"], default="model")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--updates", type=int, default=2, help="AdamW steps on each step's games (the trainer: 2)")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = build_word_tokenizer()
    policy = build_model(tokenizer, TinyModelConfig(tokenizer="words", seed=args.seed))
    critic = Critic(policy.model, tokenizer, trained_trunk=args.critic == "model")
    optimizer = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=args.lr)

    held = blind_turns(rng, HELD_OUT)
    outcomes = torch.tensor([t.outcome for t in held])
    index = torch.tensor([t.index for t in held])
    by_index = torch.stack([outcomes[index == k].mean() for k in range(GUESSES)])[index]
    true_q = torch.tensor([t.blind_q for t in held])
    second = torch.tensor([t.in_range is not None for t in held])
    inside = torch.tensor([bool(t.in_range) for t in held])

    def gap(q: torch.Tensor) -> float:
        return float(q[second & inside].mean() - q[second & ~inside].mean())

    print(
        f"critic {args.critic}, lr {args.lr}, {args.updates} updates a step, seed {args.seed}; explained variance of "
        f"the outcome: turn index alone {explained(outcomes, by_index):.3f}, true blind Q {explained(outcomes, true_q):.3f}; "
        f"true in-range gap {gap(true_q):.3f}",
        flush=True,
    )
    for step in range(1, args.steps + 1):
        turns = blind_turns(rng, GAMES_PER_STEP)
        targets = torch.tensor([t.outcome for t in turns])
        for _ in range(args.updates):
            optimizer.zero_grad(set_to_none=True)
            ((critic(turns) - targets) ** 2).mean().backward()
            optimizer.step()
        if step % args.every == 0:
            with torch.no_grad():
                q = torch.cat([critic(held[i : i + 1024]) for i in range(0, len(held), 1024)])
            print(
                f"step {step}: explained variance {explained(outcomes, q):.3f}, in-range gap {gap(q):.3f}", flush=True
            )


if __name__ == "__main__":
    main()
