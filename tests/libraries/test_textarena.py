"""TextArena's games as they ship, played through lit-agentrl fit: single-player and against a fixed opponent."""

from __future__ import annotations

import random
import sys

import pytest
import textarena as ta
from omegaconf import OmegaConf
from support import fit_rows

from lit_agentrl.agents.libraries import imports
from lit_agentrl.agents.libraries.textarena import TextArenaEnvironment, random_listed_move
from lit_agentrl.data.validation import row_errors

pytestmark = pytest.mark.slow
OPPONENT = "lit_agentrl.agents.libraries.textarena:random_listed_move"


def row(index: int, env_id: str, seed: int, **fields) -> dict:
    prompt = [{"role": "user", "content": f"Game {index}: play it."}]
    return {"agent_name": "textarena", "prompt": prompt, "env_id": env_id, "seed": seed, **fields}


def library_game(env_id: str, seed: int, actions: list[str], num_players: int = 1) -> tuple[dict, dict]:
    """The game as TextArena's own loop plays it (its default wrappers), the policy's seat fed ``actions`` and the
    other seat the same fixed opponent: TextArena's rewards and game info."""
    env = ta.make(env_id)
    env.reset(num_players=num_players, seed=seed)
    rng, moves, done = random.Random(seed), iter(actions), False
    while not done:
        seat, observation = env.get_observation()
        move = next(moves) if seat == 0 else random_listed_move(observation, rng)
        done, _ = env.step(move)
    return env.close()


def played(env: TextArenaEnvironment, game: dict, actions: list[str]) -> list[tuple[str, float, bool]]:
    env.reset({**game, "messages": []})
    return [env.step(action) for action in actions]


def test_guess_the_number_plays_as_textarena_does_turn_by_turn():
    actions = ["I think [10]", "banana", "[5]", "[3]", "[4]"]  # one invalid move (retried), then found
    steps = played(TextArenaEnvironment(None), row(0, "GuessTheNumber-v0", 42), actions)
    assert [done for *_, done in steps] == [False] * 4 + [True]
    assert steps[0][0] == "[GAME] The target number is lower."
    assert "You attempted an invalid move" in steps[1][0]
    rewards, _ = library_game("GuessTheNumber-v0", 42, actions)
    assert [reward for _, reward, _ in steps] == [0.0] * 4 + [rewards[0]] == [0.0] * 4 + [1]


def test_episodes_interleaved_draw_the_same_as_each_alone():
    """2048 draws its new tiles from Python's global random on every step: an episode's own generator state keeps
    concurrent games (and the trainer's random) apart."""
    moves = ["[up]", "[left]", "[down]", "[right]"] * 3
    alone = [played(TextArenaEnvironment(None), row(0, "2048-v0", seed), moves) for seed in (5, 6)]
    first, second = TextArenaEnvironment(None), TextArenaEnvironment(None)
    first.reset({**row(0, "2048-v0", 5), "messages": []})
    second.reset({**row(0, "2048-v0", 6), "messages": []})
    random.seed(123)
    outside = random.random()
    random.seed(123)
    interleaved: list[list] = [[], []]
    for move in moves:
        interleaved[0].append(first.step(move))
        interleaved[1].append(second.step(move))
    assert interleaved == alone
    assert random.random() == outside  # the games left the process's random where it was


def test_tictactoe_against_the_fixed_opponent_ends_as_textarena_scores_it():
    env = TextArenaEnvironment(OmegaConf.create({"opponent": OPPONENT}))
    game = row(0, "TicTacToe-v0", 3, num_players=2)
    observation, actions, done = env.reset({**game, "messages": []}), [], False
    chooser = random.Random(0)
    while not done:
        actions.append(random_listed_move(observation, chooser))
        observation, reward, done = env.step(actions[-1])
    rewards, info = library_game("TicTacToe-v0", 3, actions, num_players=2)
    assert reward == rewards[0] and env.metrics["turn_count"] == info[0]["turn_count"]


def test_games_that_cannot_run_here_are_refused_at_setup(tmp_path, monkeypatch):
    (wordle,) = row_errors(row(0, "Wordle-v0", 1), tmp_path, None)
    assert "field 'env_id': TextArena's 'Wordle-v0' cannot be built here (LookupError" in wordle
    (unknown,) = row_errors(row(0, "Wordle-v0-raw", 1), tmp_path, None)
    assert "is not a TextArena game id" in unknown
    assert "'seed' is missing" in row_errors({**row(0, "GuessTheNumber-v0", 1), "seed": None}, tmp_path, None)[0]
    import nltk

    fetched: list = []
    monkeypatch.setattr(nltk, "download", lambda *args, **kwargs: fetched.append(args))
    (hangman,) = row_errors(row(0, "Hangman-v0", 1), tmp_path, None)  # its module asks nltk for 'words' on import
    assert "LookupError: Resource 'words' not found" in hangman and fetched == []  # refused, nothing fetched
    monkeypatch.setitem(sys.modules, "textarena", None)
    imports.library_problem.cache_clear()
    try:
        (missing,) = row_errors(row(0, "GuessTheNumber-v0", 1), tmp_path, None)
    finally:
        imports.library_problem.cache_clear()
    assert "pip install 'lit-agentrl[textarena]'" in missing


def test_a_two_player_game_without_an_opponent_fails_naming_the_key():
    with pytest.raises(ValueError, match="names no 'opponent'"):
        played(TextArenaEnvironment(None), row(0, "TicTacToe-v0", 1, num_players=2, player=1), [])


def test_a_fit_plays_single_and_two_player_games_scored_as_textarena_scores_them(tmp_path, quickstart_model_dir):
    """The quickstart's word-level model answers one token, often a digit: TextArena brackets it (its default action
    formatting) and the games see valid guesses and moves as well as invalid ones."""
    cfg = tmp_path / "textarena.yaml"
    cfg.write_text(f"opponent: {OPPONENT}\nmax_turns: 12\n")
    games = [row(0, "GuessTheNumber-v0", 11), row(1, "TowerOfHanoi-v0", 12)]
    games += [row(2, "TicTacToe-v0", 13, num_players=2), row(3, "ConnectFour-v0", 14, num_players=2)]
    games = [{**game, "agent_cfg_path": str(cfg)} for game in games]
    metrics, records = fit_rows(tmp_path / "run", quickstart_model_dir, games, steps=2, max_new_tokens=1)
    assert not any(r["failed"] for r in records) and len(records) == 2 * 4 * 2 + 4
    assert any(r["extra"]["metrics"]["invalid_move"] == 0.0 for r in records)  # games ended by play, not only fouls
    by_prompt = {game["prompt"][0]["content"]: game for game in games}
    for record in records:
        game = by_prompt[record["prompt"][0]["content"]]
        actions = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        rewards, _ = library_game(game["env_id"], game["seed"], actions, game.get("num_players", 1))
        if len(actions) < 12:  # the game ended (not the agent's cap): its reward on the last turn, 0 before
            assert record["turn_rewards"] == [0.0] * (len(actions) - 1) + [rewards[0]]
    assert any(m.get("agent/textarena/turn_count") for m in metrics)
