"""ChatModel samples with the rollout's parameters, as the OpenAI gateway does: a call may lower the length and add
stop tokens, and nothing else it asks for reaches the engine (the trainer's log-probs assume the rollout's)."""

from __future__ import annotations

import asyncio

from langchain_core.messages import HumanMessage

from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.context import TrajectoryContext, enter_trajectory
from lit_agentrl.engines.base import EngineWrapper


class Seen(EngineWrapper):
    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.params: list[object] = []

    async def async_generate(self, **kwargs):
        self.params.append(kwargs["sampling_params"])
        return await self.inner.async_generate(**kwargs)


def test_a_call_in_a_rollout_samples_with_the_rollouts_parameters(scripted_engine_factory, tokenizer):
    engine = Seen(scripted_engine_factory(["one", "two"]))
    model = ChatModel(model="policy", llm=engine, tokenizer=tokenizer)
    run = SamplingParams(max_new_tokens=32, temperature=0.7)

    async def main():
        enter_trajectory(TrajectoryContext(sampling_params=run))
        await model.ainvoke([HumanMessage("hi")], sampling_params={"temperature": 0.1, "max_new_tokens": 8})
        await model.ainvoke([HumanMessage("hi")])

    asyncio.run(main())
    asked, default = engine.params
    # Typed all the way to the engine; the call's lower length used, its temperature not.
    assert isinstance(asked, SamplingParams) and (asked.temperature, asked.max_new_tokens) == (0.7, 8)
    assert default is run
