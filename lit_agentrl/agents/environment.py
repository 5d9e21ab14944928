"""Environments: a Gym-style interface that becomes an agent, so an environment's author writes no agent code.

::

    from lit_agentrl.agents import Environment, register_environment

    @register_environment("my_env")
    class MyEnv(Environment):
        def reset(self, row) -> str | None: ...                      # the first observation (None: just the prompt)
        def step(self, action: str) -> tuple[str, float, bool]: ...  # observation, reward, done

``reset`` and ``step`` may be coroutines. Each trajectory gets a fresh instance, built with the agent YAML's
config (``MyEnv(cfg)``). The agent prompts the model with the row's prompt (and the first observation as a user
turn), then for each model turn calls ``step`` with the turn's text and answers with the observation as the next
user turn, until ``done`` or ``max_turns`` (agent YAML, default 8). The trajectory's reward is the sum of the step
rewards, each also its turn's reward (``turn_rewards``); ``metrics`` (a dict on the instance) are logged as
``agent/<agent>/<name>``. Tokens are kept exactly as sampled, as in every agent
(:class:`~lit_agentrl.agents.chat_model.ChatModel`).

Environments that speak chat messages (the field's libraries, ``lit_agentrl.agents.libraries``) may instead return
from ``reset`` a list of messages (``{"role", "content"}``), the whole conversation to start from in place of the row's
prompt, and from ``step`` a list of messages to append (empty: none). ``row_errors`` (a classmethod) checks each row at
setup, as an agent's does.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from langchain_core.messages import BaseMessage, HumanMessage, convert_to_messages

from lit_agentrl.agents.base import AgentGraph, AgentGraphOutput
from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.registry import register
from lit_agentrl.types import AGENT_METRICS_FIELD

__all__ = ["Environment", "EnvironmentAgent", "register_environment"]


class Environment(ABC):
    """One episode of an environment (see the module's docstring)."""

    required_fields: ClassVar[tuple[str, ...]] = ()
    """Row fields every row of the environment must have, not null (checked at setup)."""

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg
        self.metrics: dict[str, float] = {}

    @abstractmethod
    def reset(self, row: dict[str, Any]) -> Any:
        """Start the episode for ``row``; the first observation (a string), the conversation to start from (a list
        of messages), or None."""

    @abstractmethod
    def step(self, action: str) -> Any:
        """The model's turn as text; ``(observation, reward, done)``, the observation a string or a list of
        messages."""

    def close(self) -> Any:
        """Release what the episode holds; called once the trajectory ends, however it ends. May be a coroutine."""
        return None

    @classmethod
    def row_errors(cls, row: Mapping[str, Any]) -> list[str]:
        """What is wrong with a dataset row for this environment, each naming the field; checked at setup."""
        return []


E = TypeVar("E", bound=type[Environment])


class EnvironmentAgent(AgentGraph):
    """The agent an :class:`Environment` becomes: a model turn per step."""

    environment: ClassVar[type[Environment]]
    scores_itself = True

    def build_graph(self) -> None:
        self.chatmodel = self.make_chat_model()

    async def run(self, messages: Sequence[Any], sampling_params: Mapping[str, Any], **kwargs: Any) -> AgentGraphOutput:
        if not hasattr(self, "chatmodel"):
            self.build_graph()
        max_turns = int(cfg_get(self.cfg, "max_turns", 8))
        env = type(self).environment(self.cfg)
        try:
            conversation, rewards = await self._play(env, messages, sampling_params, max_turns, kwargs)
        finally:
            await _maybe(env.close())
        output = self.convert_agent_graph_output(conversation)
        output.reward_score = 0.0  # the reward is the steps': each its turn's (turn_rewards), summed
        output.turn_rewards = rewards
        if env.metrics:
            output.extra_fields[AGENT_METRICS_FIELD] = dict(env.metrics)
        return output

    async def _play(
        self,
        env: Environment,
        messages: Sequence[Any],
        sampling_params: Mapping[str, Any],
        max_turns: int,
        row: dict[str, Any],
    ) -> tuple[list[Any], list[float]]:
        """One episode: the conversation and one reward per model turn."""
        first = await _maybe(env.reset({**row, "messages": list(messages)}))
        conversation = _as_messages(first) if isinstance(first, list) else [*messages, *_as_messages(first)]
        rewards: list[float] = []
        for _ in range(max_turns):
            reply = await self.chatmodel.ainvoke(conversation, sampling_params=sampling_params)
            conversation.append(reply)
            observation, reward, done = _checked_step(await _maybe(env.step(str(reply.content))), self.agent_name)
            rewards.append(reward)
            if done:
                break
            conversation += _as_messages(observation)
        return conversation, rewards


def _as_messages(observation: Any) -> list[BaseMessage]:
    """An observation as the messages it adds: a string is a user turn, a list is chat messages, None is nothing."""
    if observation is None:
        return []
    if isinstance(observation, list):
        return list(convert_to_messages(observation))
    return [HumanMessage(str(observation))]


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _checked_step(result: Any, agent_name: str) -> tuple[Any, float, bool]:
    if not (isinstance(result, tuple) and len(result) == 3):
        raise TypeError(f"environment {agent_name!r}: step() must return (observation, reward, done), got {result!r}")
    observation, reward, done = result
    return observation, float(reward), bool(done)


def register_environment(agent_name: str) -> Callable[[E], E]:
    """Register an :class:`Environment` subclass as the agent ``agent_name`` (rows name it in ``agent_name``)."""

    def decorator(environment: E) -> E:
        if not (isinstance(environment, type) and issubclass(environment, Environment)):
            raise TypeError(
                f"register_environment({agent_name!r}) decorates an Environment subclass, got {environment!r}"
            )
        attributes = {
            "environment": environment,
            "required_fields": tuple(environment.required_fields),
            "row_errors": classmethod(lambda cls, row: environment.row_errors(row)),
            "__module__": environment.__module__,
        }
        register(agent_name)(type(f"EnvironmentAgent_{agent_name}", (EnvironmentAgent,), attributes))
        return environment

    return decorator
