"""Agents written against an OpenAI client, trained unchanged: :func:`register_openai_agent`.

::

    from lit_agentrl.agents import register_openai_agent

    @register_openai_agent("my_agent")
    async def run(client: openai.AsyncOpenAI, row: dict, cfg) -> float | AgentResult | None:
        reply = await client.chat.completions.create(model="policy", messages=row["messages"])
        ...

For each trajectory the function gets an ``openai.AsyncOpenAI`` whose base URL points at the rollout's gateway
(:mod:`lit_agentrl.agents.gateway`) with the trajectory's own id, the row (its fields, the prompt as ``messages``,
``ground_truth``) and the agent YAML's config, and may call the model as often as it likes, with tools. It returns
the reward (a number), an :class:`AgentResult`, or None (the row's reward function then scores the last reply).
The tokens trained are the tokens the engine sampled: the gateway records them call by call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lit_agentrl.agents.base import MESSAGES_FIELD, AgentGraph, AgentGraphOutput
from lit_agentrl.agents.drift import count_openai_drift
from lit_agentrl.agents.gateway.session import GatewaySample, GatewaySession
from lit_agentrl.agents.registry import register
from lit_agentrl.context import current_trajectory
from lit_agentrl.types import AGENT_METRICS_FIELD

__all__ = ["AgentResult", "OpenAIClientAgent", "register_openai_agent"]


@dataclass
class AgentResult:
    """What an OpenAI-client agent may return instead of a bare reward."""

    reward: float | None = None
    """The trajectory's reward; None: the row's reward function scores ``final_answer`` (or the last reply)."""
    final_answer: str | None = None
    """The text the reward function scores (default: the model's last reply)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numbers logged as ``agent/<agent>/<name>``."""
    sequence_rewards: dict[str, float] = field(default_factory=dict)
    """Rewards of their own for the token sequences of a trajectory whose calls formed several (see
    ``model.loss.sequence_rewards: own``), each named by a reply it holds: the response's ``id`` (its first choice)
    or ``<id>/<choice index>``. A sequence not named gets the trajectory's reward."""
    turn_rewards: dict[str, float] = field(default_factory=dict)
    """Rewards of the model turns of the main sequence (that of the latest reply), each named by its reply as above,
    on top of ``reward``: the trajectory's reward is ``reward`` plus their sum, and turn-level advantages
    (``model.loss.advantage``) credit each to its turn. A turn not named gets 0."""


AgentFunction = Callable[[Any, dict[str, Any], Any], Awaitable["float | AgentResult | None"]]


class OpenAIClientAgent(AgentGraph):
    """The registered form of an OpenAI-client function (see the module's docstring)."""

    function: ClassVar[AgentFunction]

    def build_graph(self) -> None:
        self.chatmodel = self.make_chat_model()

    async def run(self, messages: Sequence[Any], sampling_params: Mapping[str, Any], **kwargs: Any) -> AgentGraphOutput:
        import openai

        from lit_agentrl.agents.gateway import gateway_for

        if not hasattr(self, "chatmodel"):
            self.build_graph()
        gateway = await gateway_for(self.chatmodel)  # type: ignore[arg-type]
        session = gateway.open_session(current_trajectory())
        # The gateway's one HTTP client: a client of its own per trajectory would build an SSL context each time
        # (about 30 ms here), more than the trajectory's model calls cost. Shared, so never closed here.
        client = openai.AsyncOpenAI(
            base_url=gateway.base_url(session), api_key=session.id, max_retries=0, http_client=gateway.http_client
        )
        try:
            result = await type(self).function(client, {**kwargs, "messages": list(messages)}, self.cfg)
        finally:
            gateway.close_session(session)
        return self._output(session, result)

    def _output(self, session: GatewaySession, result: float | AgentResult | None) -> AgentGraphOutput:
        if session.last is None:
            raise ValueError(f"agent {self.agent_name!r} made no model call through its client")
        result = self._result(result)
        main = session.last  # the sample of the latest reply, whose text the reward function scores
        rewards = self._sequence_rewards(session, result.sequence_rewards)
        others = [sample.sequence(rewards.get(i)) for i, sample in enumerate(session.samples) if sample is not main]
        extra: dict[str, Any] = {
            "num_model_turns": sum(sample.num_model_turns for sample in session.samples),
            "num_tool_calls": sum(sample.num_tool_calls for sample in session.samples),
            "finish_reason": main.finish_reason,
            MESSAGES_FIELD: main.messages,
        }
        if self.check_template_drift:
            extra["template_drift"] = sum(self._drift(sample) for sample in session.samples)
        metrics = {"refused_calls": float(session.refused_calls), **result.metrics}
        if session.forced_calls:
            metrics.setdefault("tool_choice_unmet", float(session.unmet_tool_choices))
        if metrics:
            extra[AGENT_METRICS_FIELD] = metrics
        if session.samples.index(main) in rewards:
            raise ValueError(
                f"agent {self.agent_name!r}: sequence_rewards names the main sequence (that of the latest reply), "
                "which the trajectory's reward scores: return its reward as the reward"
            )
        tokens = main.sequence()
        turn_rewards = self._turn_rewards(session, main, result.turn_rewards) if result.turn_rewards else None
        text = main.last_reply if result.final_answer is None else result.final_answer
        return AgentGraphOutput(
            str_output=text,
            prompt_ids=tokens.prompt_ids,
            all_token_ids=tokens.all_token_ids,
            loss_mask=tokens.loss_mask,
            response_logprobs=tokens.response_logprobs,
            reward_score=result.reward,
            turn_rewards=turn_rewards,
            num_turns=len(main.messages),
            extra_fields=extra,
            other_sequences=others,
        )

    def _drift(self, sample: GatewaySample) -> int:
        """Positions where the sample's ids differ from its conversation rendered whole (see ``agents.drift``)."""
        kwargs = getattr(self.chatmodel, "chat_template_kwargs", None)  # ChatModel's (make_chat_model builds one)
        return count_openai_drift(
            sample.messages, sample.replies, sample.outputs, sample.token_ids, self.tokenizer, sample.tools, kwargs
        )

    def _result(self, result: float | AgentResult | None) -> AgentResult:
        if isinstance(result, AgentResult):
            return result
        if result is not None and (isinstance(result, bool) or not isinstance(result, (int, float))):
            raise TypeError(
                f"agent {self.agent_name!r} returned {type(result).__name__}: return a number, an AgentResult or None"
            )
        return AgentResult(reward=None if result is None else float(result))

    def _turn_rewards(self, session: GatewaySession, main: GatewaySample, named: dict[str, float]) -> list[float]:
        """``AgentResult.turn_rewards`` as one reward per model turn of the main sequence (0 where not named)."""
        rewards = [0.0] * len(main.outputs)
        for name, reward in named.items():
            if name not in main.reply_of:
                elsewhere = any(name in sample.completion_ids for sample in session.samples)
                raise ValueError(
                    f"agent {self.agent_name!r}: turn_rewards names {name!r}, "
                    + (
                        "a reply of another sequence than the latest reply's (turn rewards credit the main one)"
                        if elsewhere
                        else f"which is no reply of this trajectory; its main sequence's are {sorted(main.reply_of)}"
                    )
                )
            rewards[main.reply_of[name]] = float(reward)
        return rewards

    def _sequence_rewards(self, session: GatewaySession, named: dict[str, float]) -> dict[int, float]:
        """``AgentResult.sequence_rewards`` by sample index; a name no sample holds is an error naming the known."""
        owner = {name: index for index, sample in enumerate(session.samples) for name in sample.completion_ids}
        rewards: dict[int, float] = {}
        for name, reward in named.items():
            if name not in owner:
                raise ValueError(
                    f"agent {self.agent_name!r}: sequence_rewards names {name!r}, which is no reply of this "
                    f"trajectory (its replies: {sorted(owner)[:8]})"
                )
            index = owner[name]
            if index in rewards and rewards[index] != float(reward):
                raise ValueError(f"agent {self.agent_name!r}: sequence_rewards gives one sequence two rewards")
            rewards[index] = float(reward)
        return rewards


def register_openai_agent(
    agent_name: str, *, required_fields: tuple[str, ...] = ()
) -> Callable[[AgentFunction], AgentFunction]:
    """Register ``async def run(client, row, cfg)`` as the agent ``agent_name`` (rows name it in ``agent_name``).
    ``required_fields``: row fields every row of the agent must have, not null (checked at setup)."""

    def decorator(function: AgentFunction) -> AgentFunction:
        if not callable(function):
            raise TypeError(f"register_openai_agent({agent_name!r}) decorates a function, got {function!r}")
        attributes = {
            "function": staticmethod(function),
            "required_fields": tuple(required_fields),
            "__module__": getattr(function, "__module__", __name__),
        }
        cls = type(f"OpenAIClientAgent_{agent_name}", (OpenAIClientAgent,), attributes)
        register(agent_name)(cls)
        return function

    return decorator
