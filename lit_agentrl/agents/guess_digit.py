"""``guess_digit``: the multi-turn quickstart's agent, a guessing game with feedback.

The row's ``secret`` is a digit. Each model turn is a guess (the first digit the model writes); the environment
answers as a user turn, ``higher``, ``lower`` or ``found`` (``?`` when the turn held no digit). The game ends
when the digit is found or after ``max_guesses`` guesses, and the agent scores itself: 1.0 if found, plus
``feedback_credit`` times how well the guesses stayed inside the range the answers left (:func:`narrowing_score`;
a shaped reward, like the single-turn quickstart's format credit: it pays for reading the answers before the model
can find digits with them).

Guessing blindly finds about 0.27 of the digits in 3 guesses; halving the range with the feedback finds 0.7, so
a reward above the blind rate can only come from reading what the environment said in earlier turns.

Agent YAML keys (all optional): ``max_guesses`` (default 3), ``feedback_credit`` (default 0: found only),
``turn_credit`` (default false: the shaped credit is summed into the outcome; true: each guess's share is reported
as its own turn's reward, ``turn_rewards``, for the turn-level advantage estimators to credit to that turn; the
trajectory's reward is the same either way).

``guess_digit_openai`` is the same game written against an OpenAI client (:func:`guess_digit_openai`), trained
through the gateway, and ``guess_digit_env`` the same game as an environment (:class:`GuessDigitEnv`): the three
train alike (tests/gateway/test_gateway_fit.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages

from lit_agentrl.agents.base import AgentGraph, AgentGraphOutput
from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.environment import Environment, register_environment
from lit_agentrl.agents.openai_client import AgentResult, register_openai_agent
from lit_agentrl.agents.registry import register

HIGHER, LOWER, FOUND, NO_GUESS = "higher", "lower", "found", "?"
_DIGIT = re.compile(r"\d")


class GuessState(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]
    guesses: list[int | None]
    """One entry per model turn: the digit guessed, or None when the turn held no digit."""


def feedback(guess: int | None, secret: int) -> str:
    """The environment's answer to one guess."""
    if guess is None:
        return NO_GUESS
    if guess == secret:
        return FOUND
    return HIGHER if secret > guess else LOWER


def parse_guess(text: str) -> int | None:
    """The first digit of a model turn, or None."""
    match = _DIGIT.search(text)
    return int(match.group()) if match else None


def narrowing_shares(guesses: Sequence[int | None], secret: int) -> list[float]:
    """How well each guess used the answers before it: for a guess inside the range the earlier answers left, the
    share of the ten digits those answers ruled out; 0 for a guess outside it, a turn with no digit, and the first
    guess (nothing ruled out yet).

    Halving the range pays most; a first guess at 0 or 9 rules out one digit and makes the next guesses worth
    little, and a turn wasted on no digit rules out nothing, so neither buys easy credit.
    """
    low, high, shares = 0, 9, []
    for guess in guesses:
        inside = guess is not None and low <= guess <= high
        shares.append(1.0 - (high - low + 1) / 10 if inside else 0.0)
        if guess is not None and guess != secret:
            low, high = (max(low, guess + 1), high) if secret > guess else (low, min(high, guess - 1))
    return shares


def narrowing_score(guesses: Sequence[int | None], secret: int) -> float:
    """The game's :func:`narrowing_shares` summed."""
    return sum(narrowing_shares(guesses, secret))


MAX_CREDIT = 0.9
"""The shaped part of the reward stays below a found digit's 1.0, so ``val/accuracy`` (reward >= 1) counts finds only."""


def game_reward(guesses: Sequence[int | None], secret: int, feedback_credit: float = 0.0) -> float:
    """1.0 if a guess found the secret, plus ``feedback_credit`` times the :func:`narrowing_score` (at most
    :data:`MAX_CREDIT`)."""
    return float(secret in guesses) + min(feedback_credit * narrowing_score(guesses, secret), MAX_CREDIT)


def turn_credits(guesses: Sequence[int | None], secret: int, feedback_credit: float) -> list[float]:
    """:func:`game_reward`'s shaped part turn by turn: ``feedback_credit`` times each guess's share, the running
    total capped at :data:`MAX_CREDIT`, so the credits sum to that part and a turn's depends on the guesses so far
    only (an environment can pay it at that step)."""
    credits, total = [], 0.0
    for share in narrowing_shares(guesses, secret):
        capped = min(total + feedback_credit * share, MAX_CREDIT)
        credits.append(capped - total)
        total = capped
    return credits


@dataclass(frozen=True)
class GameRules:
    """The agent YAML's keys, shared by the game's three forms (graph, OpenAI client, environment)."""

    max_guesses: int = 3
    feedback_credit: float = 0.0
    turn_credit: bool = False

    @classmethod
    def from_cfg(cls, cfg: Any, agent_name: str) -> GameRules:
        """Read and check the keys; a bad value is refused naming the agent, the key and what is valid."""
        max_guesses = int(cfg_get(cfg, "max_guesses", 3))
        feedback_credit = float(cfg_get(cfg, "feedback_credit", 0.0))
        turn_credit = cfg_get(cfg, "turn_credit", False)
        if max_guesses < 1:
            raise ValueError(f"agent {agent_name!r}: max_guesses must be >= 1, got {max_guesses}")
        if not 0.0 <= feedback_credit < 1.0:
            raise ValueError(f"agent {agent_name!r}: feedback_credit must be in [0, 1), got {feedback_credit}")
        if not isinstance(turn_credit, bool):
            raise ValueError(f"agent {agent_name!r}: turn_credit must be true or false, got {turn_credit!r}")
        return cls(max_guesses, feedback_credit, turn_credit)

    def rewards(self, guesses: Sequence[int | None], secret: int) -> tuple[float, list[float] | None]:
        """The trajectory's outcome and its turns' own rewards: with ``turn_credit`` the found reward and each
        turn's shaped credit; without, :func:`game_reward` and None (nothing reported per turn)."""
        if self.turn_credit:
            return float(secret in guesses), turn_credits(guesses, secret, self.feedback_credit)
        return game_reward(guesses, secret, self.feedback_credit), None


@register("guess_digit")
class GuessDigitAgentGraph(AgentGraph):
    """A LangGraph loop of ``guess`` (model) and ``answer`` (environment) nodes over a hidden digit."""

    def __init__(
        self, agent_name: str, cfg: Any, llm: Any, tokenizer: Any, processor: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(agent_name, cfg, llm, tokenizer, processor, **kwargs)
        self.rules = GameRules.from_cfg(cfg, agent_name)
        self.build_graph()

    def build_graph(self) -> Any:
        self.chatmodel = self.make_chat_model()
        workflow = StateGraph(GuessState)
        workflow.add_node("guess", self._guess)
        workflow.add_node("answer", self._answer)
        workflow.set_entry_point("guess")
        workflow.add_conditional_edges("guess", self._after_guess, {"answer": "answer", "end": END})
        workflow.add_edge("answer", "guess")
        self.graph = workflow.compile()
        return self.graph

    async def _guess(self, state: GuessState, config: RunnableConfig) -> dict[str, Any]:
        params = config["configurable"]["sampling_params"]
        message = await self.chatmodel.ainvoke(state["messages"], sampling_params=params)
        return {"messages": [message], "guesses": [*state["guesses"], parse_guess(str(message.content))]}

    def _after_guess(self, state: GuessState, config: RunnableConfig) -> str:
        found = state["guesses"][-1] == config["configurable"]["secret"]
        return "end" if found or len(state["guesses"]) >= self.rules.max_guesses else "answer"

    async def _answer(self, state: GuessState, config: RunnableConfig) -> dict[str, list[HumanMessage]]:
        return {"messages": [HumanMessage(feedback(state["guesses"][-1], config["configurable"]["secret"]))]}

    @classmethod
    def row_errors(cls, row: Mapping[str, Any]) -> list[str]:
        problem = _secret_problem(row.get("secret"))
        return [problem] if problem else []

    async def run(
        self, messages: Sequence[Any], sampling_params: Mapping[str, Any], secret: Any = None, **kwargs: Any
    ) -> AgentGraphOutput:
        problem = _secret_problem(secret)
        if problem:
            raise ValueError(f"agent {self.agent_name!r}: {problem}")
        secret = int(secret)
        config: RunnableConfig = {"configurable": {"sampling_params": sampling_params, "secret": secret}}
        state = await self.graph.ainvoke({"messages": list(messages), "guesses": []}, config=config)
        output = self.convert_agent_graph_output(state)
        guesses = state["guesses"]
        output.reward_score, output.turn_rewards = self.rules.rewards(guesses, secret)
        output.extra_fields.update(guesses=guesses, metrics=turn_metrics(guesses, secret))
        return output


def _secret_problem(secret: Any) -> str | None:
    # Data loaders turn an integer column into floats when any row holds a float: 4.0 is still the digit 4.
    if isinstance(secret, (int, float)) and not isinstance(secret, bool) and secret in range(10):
        return None
    return f"row field 'secret' must be a digit 0-9 (an integer), got {secret!r}"


def turn_metrics(guesses: Sequence[int | None], secret: int) -> dict[str, float]:
    """``found_turn_k``: 1.0 when the game reached turn k and the guess there was right, 0.0 when it was wrong.

    Averaged over the games that reached turn k, a rising ``found_turn_2``/``found_turn_3`` shows the model
    using the feedback: blind guessing stays near 1/10 at every turn, and a model that never reads the feedback
    cannot do better than 1/9 and 1/8 there by avoiding its own earlier guesses.
    """
    found_at = guesses.index(secret) + 1 if secret in guesses else 0
    return {f"found_turn_{k}": float(found_at == k) for k in range(1, len(guesses) + 1)}


@register_openai_agent("guess_digit_openai", required_fields=("secret",))
async def guess_digit_openai(client: Any, row: dict[str, Any], cfg: Any) -> AgentResult:
    """The same game written against an OpenAI client, as most agents outside this project are: the multi-turn
    quickstart's ``configs/quickstart_multiturn_openai.yaml`` trains it through the gateway."""
    problem = _secret_problem(row.get("secret"))
    if problem:
        raise ValueError(f"agent 'guess_digit_openai': {problem}")
    secret = int(row["secret"])
    rules = GameRules.from_cfg(cfg, "guess_digit_openai")
    messages: list[dict[str, Any]] = list(row["messages"])
    guesses: list[int | None] = []
    replies: list[str] = []
    for _ in range(rules.max_guesses):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        replies.append(reply.id)
        text = reply.choices[0].message.content or ""
        guesses.append(parse_guess(text))
        messages.append({"role": "assistant", "content": text})
        if guesses[-1] == secret:
            break
        messages.append({"role": "user", "content": feedback(guesses[-1], secret)})
    reward, per_turn = rules.rewards(guesses, secret)
    turn_rewards = dict(zip(replies, per_turn)) if per_turn is not None else {}
    return AgentResult(reward=reward, metrics=turn_metrics(guesses, secret), turn_rewards=turn_rewards)


@register_environment("guess_digit_env")
class GuessDigitEnv(Environment):
    """The same game as a Gym-style environment: no agent code at all (agent YAML keys as above)."""

    required_fields = ("secret",)

    def reset(self, row: dict[str, Any]) -> None:
        problem = _secret_problem(row.get("secret"))
        if problem:
            raise ValueError(f"environment 'guess_digit_env': {problem}")
        self.secret = int(row["secret"])
        self.guesses: list[int | None] = []
        self.rules = GameRules.from_cfg(self.cfg, "guess_digit_env")

    def step(self, action: str) -> tuple[str, float, bool]:
        """A step's reward is its turn's: with ``turn_credit`` the turn's shaped credit (plus 1 on the turn that
        finds the digit); without, 0 until the game's whole reward on its last step."""
        guess = parse_guess(action)
        self.guesses.append(guess)
        done = guess == self.secret or len(self.guesses) >= self.rules.max_guesses
        outcome, per_turn = self.rules.rewards(self.guesses, self.secret)
        reward = (per_turn[-1] if per_turn is not None else 0.0) + (outcome if done else 0.0)
        if not done:
            return feedback(guess, self.secret), reward, False
        self.metrics = turn_metrics(self.guesses, self.secret)
        return "", reward, True
