"""A minimal GRPO loop on the guessing game, with no Lightning, LangGraph or engine: the reference for issue 17.

It plays ``guess_digit`` itself (same tiny model and tokenizer as the multi-turn quickstart), samples with
``torch.multinomial``, and trains with the plainest possible update: group-normalised advantages,
-advantage x log-prob summed over generated tokens and divided by their count, AdamW, gradient clipping.

``--format chat`` builds exactly the token sequences the ``guess_digit`` agent builds (the chat template's prompt,
each feedback as the template's user turn after the assistant's); ``--format compact`` uses ``guess g1 f1 g2 f2 g3``.
Comparing the two, and ``--turn-tokens 1`` with ``2``, tells the scaffolding's cost from the learning rule's.

    python benchmarks/minimal_guess_loop.py --model .cache/quickstart-model --format chat --turn-tokens 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.agents.guess_digit import feedback, game_reward, parse_guess


class Game:
    """One trajectory: token ids, loss mask, and the game's state."""

    def __init__(self, prompt: list[int], secret: int, group: int) -> None:
        self.ids, self.mask = list(prompt), [0] * len(prompt)
        self.secret, self.group = secret, group
        self.guesses: list[int | None] = []
        self.done = False


def play(model, tok, games: list[Game], args, rng: torch.Generator) -> None:
    """Every game to its end: each turn samples up to ``turn_tokens`` tokens for all live games at once."""
    eos = tok.eos_token_id
    for _ in range(args.max_guesses):
        live = [g for g in games if not g.done]
        if not live:
            return
        outs: list[list[int]] = [[] for _ in live]
        for _ in range(args.turn_tokens):
            active = [i for i, o in enumerate(outs) if not (o and o[-1] == eos)]
            if not active:
                break
            seqs = [live[i].ids + outs[i] for i in active]
            width = max(map(len, seqs))
            batch = torch.full((len(seqs), width), tok.pad_token_id)
            attn = torch.zeros((len(seqs), width), dtype=torch.long)
            for r, s in enumerate(seqs):  # left padding
                batch[r, width - len(s) :] = torch.tensor(s)
                attn[r, width - len(s) :] = 1
            positions = (attn.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                logits = model(input_ids=batch, attention_mask=attn, position_ids=positions).logits[:, -1].float()
            tokens = torch.multinomial(torch.softmax(logits, -1), 1, generator=rng).squeeze(-1).tolist()
            for i, t in zip(active, tokens):
                outs[i].append(t)
        for g, out in zip(live, outs):
            g.ids += out
            g.mask += [1] * len(out)
            text = tok.decode([t for t in out if t != eos])
            guess = parse_guess(text)
            g.guesses.append(guess)
            if guess == g.secret or len(g.guesses) >= args.max_guesses:
                g.done = True
                continue
            answer = feedback(guess, g.secret)
            if args.format == "chat":
                suffix = args.chat.encode_suffix([{"role": "user", "content": answer}], None, out)
            else:
                suffix = tok.encode(answer, add_special_tokens=False)
            g.ids += suffix
            g.mask += [0] * len(suffix)


def train_step(model, optimizer, games: list[Game], args, pad: int) -> dict[str, float]:
    rewards = torch.tensor([game_reward(g.guesses, g.secret, args.feedback_credit) for g in games])
    groups = torch.tensor([g.group for g in games])
    adv = torch.zeros_like(rewards)
    for gid in groups.unique():
        sel = groups == gid
        r = rewards[sel]
        adv[sel] = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
    width = max(len(g.ids) for g in games) - 1
    ids = torch.full((len(games), width), pad)
    targets = torch.full((len(games), width), pad)
    mask = torch.zeros((len(games), width))
    for r, g in enumerate(games):
        n = len(g.ids) - 1
        ids[r, :n], targets[r, :n] = torch.tensor(g.ids[:-1]), torch.tensor(g.ids[1:])
        mask[r, :n] = torch.tensor(g.mask[1:], dtype=torch.float)
    logits = model(input_ids=ids).logits.float()
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    n = mask.sum()
    loss = -(adv.unsqueeze(-1) * logp * mask).sum() / n - args.entropy_coef * (entropy * mask).sum() / n
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return {"entropy": float((entropy.detach() * mask).sum() / n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=".cache/quickstart-model")
    parser.add_argument("--format", choices=["chat", "compact"], default="chat")
    parser.add_argument("--turn-tokens", type=int, default=2)
    parser.add_argument("--max-guesses", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--entropy-coef", type=float, default=0.0)
    parser.add_argument("--feedback-credit", type=float, default=0.0, help="guess_digit's feedback_credit")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write per-step records as JSON lines here")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).train()
    args.chat = ChatModel(model="minimal-loop", llm=None, tokenizer=tok)  # renders turns exactly as the agent's does
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=0.0)
    if args.format == "chat":
        prompt = args.chat.render_ids([{"role": "user", "content": "guess"}], None, add_generation_prompt=True)
    else:
        prompt = tok.encode("guess", add_special_tokens=False)
    secrets_rng, sample_rng = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    records = []
    start = time.perf_counter()
    for step in range(args.steps):
        games = [
            Game(prompt, s, p)
            for p, s in enumerate(secrets_rng.randrange(10) for _ in range(args.prompts))
            for _ in range(args.samples)
        ]
        model.eval()
        play(model, tok, games, args, sample_rng)
        model.train()
        stats = train_step(model, optimizer, games, args, tok.pad_token_id)
        found = [g.guesses.index(g.secret) + 1 if g.secret in g.guesses else 0 for g in games]
        rewards = [game_reward(g.guesses, g.secret, args.feedback_credit) for g in games]
        record = {
            "step": step,
            "reward": statistics.fmean(rewards),
            "found": statistics.fmean(f > 0 for f in found),
            **stats,
        }
        for turn in range(1, args.max_guesses + 1):  # success at turn k among games still going at turn k
            reached = [f for f in found if f == 0 or f >= turn]
            record[f"found_at_{turn}"] = sum(f == turn for f in found) / max(1, len(reached))
        records.append(record)
        if step % 50 == 0:
            print(json.dumps({k: round(v, 3) for k, v in record.items()}), flush=True)
    fifth = args.steps // 5
    for key in ("reward", "found"):
        first = statistics.fmean(r[key] for r in records[:fifth])
        last = statistics.fmean(r[key] for r in records[-fifth:])
        print(
            f"{key}: first fifth {first:.3f} -> last fifth {last:.3f} ({last - first:+.3f}); {time.perf_counter() - start:.0f}s"
        )
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
