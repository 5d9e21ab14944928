"""The multi-turn quickstart's first guess written with each kind of OpenAI-compatible client, for the CLI fit of
``test_gateway_fit.py`` (imported through ``data.agent_modules``): LangChain's ``ChatOpenAI``, LangGraph's prebuilt
ReAct agent, the OpenAI Agents SDK, smolagents, and an agent whose calls form several sequences (a fresh context and
``n`` choices). Each returns 1 when a reply holds the secret digit."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from lit_agentrl.agents import AgentResult, register_openai_agent
from lit_agentrl.agents.guess_digit import parse_guess


def _found(text: str | None, row: dict) -> float:
    return float(parse_guess(text or "") == int(row["secret"]))


@register_openai_agent("kinds_chatopenai", required_fields=("secret",))
async def chatopenai(client: Any, row: dict, cfg: Any) -> float:
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    reply = await model.ainvoke(row["messages"])
    return _found(str(reply.content), row)


@register_openai_agent("kinds_react", required_fields=("secret",))
async def react(client: Any, row: dict, cfg: Any) -> float:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def hint(digit: int) -> str:
        """Whether the secret is higher or lower than a digit."""
        return "higher" if int(row["secret"]) > digit else "lower"

    model = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    state = await create_react_agent(model, [hint]).ainvoke({"messages": row["messages"]})
    return _found(str(state["messages"][-1].content), row)


@register_openai_agent("kinds_agents_sdk", required_fields=("secret",))
async def agents_sdk(client: Any, row: dict, cfg: Any) -> float:
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner

    agent = Agent(name="guesser", model=OpenAIChatCompletionsModel(model="policy", openai_client=client))
    result = await Runner.run(agent, row["messages"], run_config=RunConfig(tracing_disabled=True))
    return _found(str(result.final_output), row)


@register_openai_agent("kinds_smolagents", required_fields=("secret",))
async def smol(client: Any, row: dict, cfg: Any) -> float:
    from smolagents import OpenAIServerModel

    model = OpenAIServerModel(model_id="policy", api_base=str(client.base_url), api_key=client.api_key)
    reply = await asyncio.to_thread(model.generate, row["messages"])
    return _found(reply.content if isinstance(reply.content, str) else None, row)


@register_openai_agent("kinds_several_sequences", required_fields=("secret",))
async def several(client: Any, row: dict, cfg: Any) -> AgentResult:
    """A fresh context, then two choices: three sequences, the main one (the first choice of the latest call)
    scored by the trajectory's reward, the others by their own."""
    fresh = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "guess"}])
    last = await client.chat.completions.create(model="policy", messages=row["messages"], n=2)
    found = [_found(choice.message.content, row) for choice in last.choices]
    return AgentResult(reward=found[0], sequence_rewards={fresh.id: 0.0, f"{last.id}/1": found[1]})


PROGRAM = [
    sys.executable,
    "-c",
    """
import json, sys, openai
row = json.load(sys.stdin)
reply = openai.OpenAI(max_retries=0).chat.completions.create(model="policy", messages=row["messages"])
text = reply.choices[0].message.content or ""
print(json.dumps({"reward": float(str(row["secret"]) in text)}))
""",
]
"""An external program (``openai_command``): the official synchronous client, configured by the environment."""
