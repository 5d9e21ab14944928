"""``textarena``: TextArena's games (``ta.make``), single-player and against a fixed opponent, trained as they are.

A row names the game and the episode: ``env_id`` (a registered base id, e.g. ``GuessTheNumber-v0``,
``TowerOfHanoi-v0``, ``TicTacToe-v0``), ``seed`` (the episode: every sample of a prompt group plays the same game),
and optionally ``num_players`` (default 1), ``player`` (the policy's seat, default 0) and ``env_kwargs`` (the game's
own arguments, e.g. ``{min_number: 1, max_number: 20}``). The row's ``prompt`` opens the conversation (an
instruction like "play the game below") and the game's first observation follows as a user turn.

Mapping: each model turn is one ``env.step`` (TextArena's default action formatting: an action without brackets is
sent bracketed); the observation is what the game told the policy's seat since its last turn, as TextArena's
``LLMObservationWrapper`` words it (``[GAME] ...``, ``[Player 1] ...``) but only the new lines, as a user turn. The
game's other seats are played by the agent YAML's ``opponent`` (``"module:function"``, called with the text the
opponent's seat sees and a ``random.Random`` of the episode; :func:`random_listed_move` ships) between the
policy's turns. An invalid move is the game's business (TextArena lets a seat retry once, then ends the game). The
reward is the game's own, from ``env.close()``, on the last turn (single-player: 1 for a win, else the game's partial
credit in [0, 1]; two-player: 1, 0 or -1); ``agent/textarena/turn_count`` and ``invalid_move`` are logged.

TextArena seeds Python's global ``random`` at reset and some games draw from it on every step (2048's tiles); each
episode here keeps a generator state of its own, swapped in around every call into the game, so concurrent
episodes neither disturb each other nor the trainer. Games that need a download (nltk's word lists: Wordle, Hangman,
WordLadder) or an API key (TwentyQuestions) are refused at setup, naming the game and its error.
"""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from functools import cache
from typing import Any, ClassVar, cast
from unittest import mock

from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.environment import Environment, register_environment
from lit_agentrl.agents.libraries.imports import import_object, library_problem, require

__all__ = ["TextArenaEnvironment", "random_listed_move"]

AGENT = "textarena"
EXTRA = "textarena"
_USER = f"agent {AGENT!r}"
GAME_ID = -1  # TextArena's sender id of the game itself

Opponent = Callable[[str, random.Random], str]
"""``(observation, rng) -> action``: a fixed policy for the seats the model does not play."""


def _textarena() -> Any:
    return require("textarena", extra=EXTRA, user=_USER)


def random_listed_move(observation: str, rng: random.Random) -> str:
    """A uniformly random move among those the game lists last (``Available Moves: '[0]', '[4]'``: TicTacToe and
    other board games); ``[0]`` when the observation lists none."""
    listed = observation.rsplit("Available Moves:", 1)
    moves = re.findall(r"'(\[[^\]]*\])'", listed[1]) if len(listed) == 2 else []
    return rng.choice(moves) if moves else "[0]"


@register_environment(AGENT)
class TextArenaEnvironment(Environment):
    """One game of TextArena, the policy in one seat."""

    required_fields: ClassVar[tuple[str, ...]] = ("env_id", "seed")

    def reset(self, row: dict[str, Any]) -> str:
        ta = _textarena()
        self.player = int(row.get("player") or 0)
        self.rng = random.Random(row["seed"])
        self._random_state = random.Random(row["seed"]).getstate()
        self.opponent = _opponent(cfg_get(self.cfg, "opponent", None))
        with self._own_random():
            env = _made(ta, row["env_id"], dict(row.get("env_kwargs") or {}))
            self.env = ta.wrappers.ActionFormattingWrapper(env)
            self.env.reset(num_players=int(row.get("num_players") or 1), seed=int(row["seed"]))
        self.closed = False
        return self._observation_after(done=False)

    def step(self, action: str) -> tuple[str, float, bool]:
        with self._own_random():
            done, _info = self.env.step(action)
        observation = self._observation_after(done)
        if self.closed or done:
            return observation, self._final_reward(), True
        return observation, 0.0, False

    def close(self) -> None:
        if hasattr(self, "env") and not self.closed:
            with self._own_random():
                self.env.close()
            self.closed = True

    def _observation_after(self, done: bool) -> str:
        """The opponents' turns until the policy's seat is to move (or the game ends): what that seat was told."""
        while not done:
            with self._own_random():
                seat, messages = self.env.get_observation()
            if seat == self.player:
                return self._text(messages)
            if self.opponent is None:
                raise ValueError(
                    f"{_USER}: seat {seat} is to move but the agent YAML names no 'opponent' "
                    "(e.g. opponent: lit_agentrl.agents.libraries.textarena:random_listed_move)"
                )
            with self._own_random():
                done, _info = self.env.step(self.opponent(self._text(messages), self.rng))
        self.closed = True
        with self._own_random():
            self.rewards, self.game_info = self.env.close()
        return ""

    def _final_reward(self) -> float:
        reward = self.rewards.get(self.player)
        info = self.game_info.get(self.player, {})
        self.metrics = {
            "turn_count": float(info.get("turn_count", 0)),
            "invalid_move": float(bool(info.get("invalid_move"))),
        }
        if not isinstance(reward, (int, float)):  # TextArena 0.7.4 passes its reason as the reward in some games
            raise ValueError(f"{_USER}: the game returned {reward!r} as seat {self.player}'s reward ({info})")
        return float(reward)

    def _text(self, messages: list[tuple[int, str, Any]]) -> str:
        """New messages as ``LLMObservationWrapper`` words them, without the seat's own action (its model turn)."""
        roles = self.env.state.role_mapping
        lines = []
        for sender, message, kind in messages:
            if sender == self.player and kind.name == "PLAYER_ACTION":
                continue
            name = "GAME" if sender == GAME_ID else roles.get(sender, f"Player {sender}")
            lines.append(f"[{name}] {message}")
        return "\n".join(lines)

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        """Python's global ``random`` holds this episode's state for the length of one call into the game."""
        outside = random.getstate()
        random.setstate(self._random_state)
        try:
            yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outside)

    @classmethod
    def row_errors(cls, row: Mapping[str, Any]) -> list[str]:
        problem = library_problem("textarena", extra=EXTRA, user=_USER)
        if problem:
            return [problem]
        env_id = row.get("env_id")
        if not isinstance(env_id, str):
            return [] if env_id is None else [f"field 'env_id' must be a TextArena id string, got {env_id!r}"]
        problem = _game_problem(env_id, tuple(sorted(dict(row.get("env_kwargs") or {}).items())))
        return [f"field 'env_id': {problem}"] if problem else []


@cache
def _game_problem(env_id: str, env_kwargs: tuple[tuple[str, Any], ...]) -> str | None:
    """Why the game cannot be played here (unknown, a download it needs, an error building it), or None."""
    ta = _textarena()
    registry = ta.envs.registration.ENV_REGISTRY
    if f"{env_id}-raw" not in registry:
        base_ids = sorted(name for name in registry if f"{name}-raw" in registry)
        return f"{env_id!r} is not a TextArena game id (name the base id, without -raw/-train); e.g. {base_ids[:12]}"
    state = random.getstate()
    try:
        _made(ta, env_id, dict(env_kwargs))
    except Exception as exc:  # nltk's LookupError for a missing corpus, KeyError for an API key, SyntaxError, ...
        detail = " ".join(str(exc).replace("*", " ").split())[:300]
        return f"TextArena's {env_id!r} cannot be built here ({type(exc).__name__}: {detail})"
    finally:
        random.setstate(state)
    return None


def _made(ta: Any, env_id: str, env_kwargs: dict[str, Any]) -> Any:
    """``ta.make`` of the game's raw version, fetching nothing: TextArena's word games call ``nltk.download`` when
    their module is imported, and a run reaches no network, so a corpus not installed fails as nltk's ``LookupError``
    naming it (refused at setup) instead of a download attempt."""
    nltk = _import_optional("nltk")
    with ExitStack() as stack:
        if nltk is not None:  # nltk.download returns False when it fetched nothing
            stack.enter_context(mock.patch.object(nltk, "download", lambda *args, **kwargs: False))
        return ta.make(f"{env_id}-raw", **env_kwargs)


def _import_optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _opponent(path: str | None) -> Opponent | None:
    return None if path is None else cast(Opponent, import_object(str(path), key="opponent", user=_USER))
