"""``slow_tail_single_turn``: ``single_turn`` after sleeping the row's ``tail_delay`` seconds (a slow tool), so a
rollout's groups finish at different times (tests of RolloutCallback.ready_fraction)."""

from __future__ import annotations

import asyncio
from typing import Any

from lit_agentrl.agents import AgentGraphOutput, register
from lit_agentrl.agents.single_turn import SingleTurnAgentGraph


@register("slow_tail_single_turn")
class SlowTailSingleTurn(SingleTurnAgentGraph):
    async def run(
        self, messages: Any, sampling_params: dict[str, Any], tail_delay: float = 0.0, **kwargs: Any
    ) -> AgentGraphOutput:
        await asyncio.sleep(tail_delay)
        return await super().run(messages, sampling_params, **kwargs)
