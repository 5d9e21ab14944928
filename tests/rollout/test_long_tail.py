"""A step that does not wait for its rollout's long tail: groups taken as they finish, the rest carried to the next
step (``lit_agentrl.rollout.tail``, ``RolloutCallback.ready_fraction``)."""

from __future__ import annotations

import asyncio
import threading

from support import ScriptedEngine

from lit_agentrl.agents import AgentGraph, AgentGraphOutput, register
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rollout.tail import take_ready

PARAMS = {"max_new_tokens": 4, "temperature": 1.0}
RELEASE = threading.Event()  # a held row's agent finishes once the test sets it


@register("tail_test_agent")
class SleepyAgent(AgentGraph):
    """Sleeps for its row's ``delay`` (a slow tool), or until the test sets :data:`RELEASE` if the row is ``held``,
    then answers with the row's ``tag`` as its reward."""

    def build_graph(self) -> None: ...

    async def run(
        self, messages, sampling_params, delay: float = 0.0, tag: float = 0.0, held: bool = False, **kwargs
    ) -> AgentGraphOutput:
        await asyncio.sleep(delay)
        if held:
            assert await asyncio.to_thread(RELEASE.wait, 120), "the test never released this row"
        return AgentGraphOutput(
            str_output="x",
            prompt_ids=[1, 2],
            all_token_ids=[1, 2, 3],
            loss_mask=[0, 0, 1],
            response_logprobs=[-1.0],
            reward_score=tag,
            num_turns=1,
        )


class BesideTrainer(ScriptedEngine):
    generates_beside_trainer = True


def rows(delays: list[float], first_tag: int, held: int | None = None) -> list[dict]:
    return [
        {
            "agent_name": "tail_test_agent",
            "prompt": [{"role": "user", "content": f"q{first_tag + i}"}],
            "delay": d,
            "tag": float(first_tag + i),
            "held": i == held,
        }
        for i, d in enumerate(delays)
    ]


def test_a_step_takes_its_finished_groups_and_the_next_step_gets_the_tail(tokenizer) -> None:
    manager = RolloutManager([BesideTrainer(None, tokenizer, [])], tokenizer, check_template_drift=False)
    try:
        RELEASE.clear()
        first = rows([0.0, 0.0, 0.0, 0.0], first_tag=0, held=1)  # group 1 cannot finish before the step is taken
        step = take_ready(first, manager.submit_groups(first, 2, PARAMS), (0, 0), 0.5, None)
        RELEASE.set()
        ready = [r["tag"] for r in step.rows]
        assert len(ready) >= 2 and set(ready) <= {0.0, 2.0, 3.0} and step.carried_in == 0  # half, never the slow one
        assert step.carried is not None and step.carried.key == (0, 0) and 1 in step.carried.groups
        assert sorted([*ready, *(first[g]["tag"] for g in step.carried.groups)]) == [0.0, 1.0, 2.0, 3.0]
        assert [t.group for t in step.trajectories] == [g for g in range(len(ready)) for _ in range(2)]
        assert [t.reward for t in step.trajectories] == [tag for tag in ready for _ in range(2)]
        tail = [first[g]["tag"] for g in step.carried.groups]

        second = rows([0.0, 0.0, 0.0, 0.0], first_tag=10)
        step = take_ready(second, manager.submit_groups(second, 2, PARAMS), (0, 1), 1.0, step.carried)
        assert step.carried is None and step.carried_in == len(tail)
        assert [r["tag"] for r in step.rows] == [*tail, 10.0, 11.0, 12.0, 13.0]  # the tail first, then the step's own
        by_group = {t.group: t.reward for t in step.trajectories}
        assert by_group == {g: r["tag"] for g, r in enumerate(step.rows)}  # groups index the rows trained
        assert len(step.trajectories) == 2 * len(step.rows) and not any(t.failed for t in step.trajectories)
    finally:
        manager.close()
