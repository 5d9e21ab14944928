"""Multi-turn rollouts with a slow, heavy-tailed tool: the rollout manager vs a lockstep baseline.

Every trajectory makes 3 model turns of up to ``--new-tokens`` tokens on the shared 2.5M-parameter Qwen3
(``benchmarks/shared.py``), with a tool call between them. Tool latencies are heavy-tailed, as code
sandboxes and search tools behave, and the same for the same (trajectory, turn) on both sides:
``--latency bimodal``: 20 ms 90% of the time, 1 s otherwise; ``--latency pareto``: 20 ms x a Pareto(1.2) draw,
capped at 2 s (median ~36 ms, about 1 call in 100 over 1 s). (a) the rollout manager runs every trajectory as its own LangGraph task;
(b) the lockstep baseline runs each turn for the whole batch together and waits for the batch's slowest
tool before the next turn, as batch-synchronous trainers do; (c) the generation side of
``RolloutCallback(async_rollouts: {ahead: 2, partial: true})``: consecutive steps' rollouts through the
manager's background thread, ``--depth`` in flight at once (two by default, as ``ahead: 2`` keeps them), so
one rollout's slow tail overlaps the next one's start (seconds per rollout over ``--pipeline`` rollouts);
(d) ``ready_fraction: 0.5`` on top (``ahead: 1``): each step takes its groups once half have finished and
carries the rest to the next step, the next step's rollout one step ahead (seconds per step). Same engine, same
chat model, same prompts. ``--engine transformers_process`` runs the engine in a process of its own (one with
``--threads`` torch threads), so the agents' Python does not share its interpreter lock; ``--device cuda`` runs it on
a GPU. Every side reports the engine's compute too: lockstep's compute over its wall time is the floor for any
schedule that computes as much (on this CPU the async sides compute about what lockstep does).

    python benchmarks/multiturn_slow_tools.py --threads 1 --latency pareto
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import torch
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, StateGraph
from langgraph.graph.message import add_messages
from shared import SHARED_MODEL
from transformers import AutoTokenizer

from lit_agentrl.agents import AgentGraph, ChatModel, register
from lit_agentrl.engines import get_engine_class
from lit_agentrl.engines.admission import ROLLOUT_TRAJECTORY
from lit_agentrl.models.tiny import save_tiny_model
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rollout.tail import take_ready

TURNS = 3
PARAMS = {"max_new_tokens": 64, "temperature": 1.0, "ignore_eos": True}


LATENCY = "pareto"


def tool_latency(row_id: int, sample: int, turn: int) -> float:
    """A fixed heavy-tailed draw per (trajectory, turn), from the distribution named by ``LATENCY``."""
    u = (int.from_bytes(hashlib.sha256(f"{row_id}/{sample}/{turn}".encode()).digest()[:4], "little") + 1) / (2**32 + 1)
    if LATENCY == "bimodal":
        return 1.0 if u < 0.1 else 0.02
    return min(2.0, 0.02 * u ** (-1 / 1.2))


class State(TypedDict):
    messages: Annotated[Sequence[BaseMessage], add_messages]
    turn: int


@register("slow_tool_benchmark_agent")
class SlowToolAgent(AgentGraph):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.build_graph()
        workflow = StateGraph(State)
        workflow.add_node("agent", self._model)
        workflow.add_node("tool", self._tool)
        workflow.set_entry_point("agent")
        workflow.add_conditional_edges(
            "agent", lambda s: "tool" if s["turn"] < TURNS else "end", {"tool": "tool", "end": END}
        )
        workflow.add_edge("tool", "agent")
        self.graph = workflow.compile()

    async def _model(self, state: State, config: RunnableConfig) -> dict:
        message = await self.chatmodel.ainvoke(state["messages"], sampling_params=PARAMS)
        return {"messages": [message], "turn": state["turn"] + 1}

    async def _tool(self, state: State, config: RunnableConfig) -> dict:
        key = config["configurable"]
        await asyncio.sleep(tool_latency(key["row_id"], key["sample"], state["turn"]))
        return {"messages": [HumanMessage("observation: done")]}

    async def run(self, messages, sampling_params, **kwargs):
        tag = ROLLOUT_TRAJECTORY.get()  # the same (row, sample) latencies in every rollout
        assert tag is not None
        config = {"configurable": {"row_id": kwargs["row_id"], "sample": tag.key[1]}}
        state = await self.graph.ainvoke({"messages": list(messages), "turn": 0}, config=config)
        output = self.convert_agent_graph_output(state)
        output.reward_score = 0.0
        return output


async def lockstep(chat: ChatModel, rows: list[dict], n: int) -> None:
    """Each turn for the whole batch at once; the next turn waits for every tool call of this one."""
    conversations = [(row["row_id"], s, list(row["prompt"])) for row in rows for s in range(n)]
    for turn in range(1, TURNS + 1):
        replies = await asyncio.gather(*(chat.ainvoke(msgs, sampling_params=PARAMS) for _, _, msgs in conversations))
        for (_, _, msgs), reply in zip(conversations, replies):
            msgs.append(reply)
        if turn < TURNS:
            await asyncio.gather(*(asyncio.sleep(tool_latency(r, s, turn)) for r, s, _ in conversations))
            for _, _, msgs in conversations:
                msgs.append(HumanMessage("observation: done"))


def pipelined(manager: RolloutManager, rows: list[dict], n: int, rollouts: int, depth: int = 2) -> float:
    """Seconds per rollout over ``rollouts`` consecutive ones, ``depth`` in flight at a time."""
    start, in_flight = time.perf_counter(), collections.deque()
    for index in range(rollouts):
        if len(in_flight) == depth:
            in_flight.popleft().result()
        in_flight.append(manager.submit(rows, n, PARAMS, seed=index))
    for future in in_flight:
        assert future.result().stats.num_failed == 0
    return (time.perf_counter() - start) / rollouts


def tail_carried(manager: RolloutManager, rows: list[dict], n: int, rollouts: int, fraction: float = 0.5) -> float:
    """Seconds per step over ``rollouts`` consecutive steps that take their finished groups once ``fraction`` of them
    have finished and carry the rest to the next step, with the next step's rollout started one step ahead
    (``async_rollouts: {ahead: 1, partial: true, ready_fraction: 0.5}``); the last step's tail is waited for too."""
    start, carried = time.perf_counter(), None
    coming = manager.submit_groups(rows, n, PARAMS, seed=0)
    for index in range(rollouts):
        current = coming
        if index + 1 < rollouts:
            coming = manager.submit_groups(rows, n, PARAMS, seed=index + 1)
        step = take_ready(rows, current, (0, index), fraction, carried)
        assert not any(t.failed for t in step.trajectories)
        carried = step.carried
    if carried is not None:
        carried.rollout.take(carried.groups)
    return (time.perf_counter() - start) / rollouts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per model turn")
    parser.add_argument("--prefix-cache-mb", type=float, default=256, help="the engine's prefix cache (0: off)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency", choices=["pareto", "bimodal"], default="pareto")
    parser.add_argument("--pipeline", type=int, default=4, help="consecutive rollouts of the async side")
    parser.add_argument(
        "--depth", type=int, default=2, help="rollouts in flight on the async side (async_rollouts.ahead: DEPTH)"
    )
    parser.add_argument("--engine", choices=["transformers", "transformers_process"], default="transformers")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default="float32", help="the engine's weights and KV"
    )
    parser.add_argument("--device", default="cpu", help="the engine's device (cuda: a GPU, where the tools dominate)")
    args = parser.parse_args()
    global LATENCY
    LATENCY = args.latency
    PARAMS["max_new_tokens"] = args.new_tokens
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(save_tiny_model(tmp, SHARED_MODEL))
        tokenizer = AutoTokenizer.from_pretrained(path)
        process = {"threads": args.threads} if args.engine == "transformers_process" else {}
        settings = {"prefix_cache_mb": args.prefix_cache_mb, "dtype": args.dtype, "device": args.device, **process}
        engine = get_engine_class(args.engine)(path, **settings)
        rows = [
            {
                "agent_name": "slow_tool_benchmark_agent",
                "row_id": i,
                "prompt": [{"role": "user", "content": f"task {i}"}],
            }
            for i in range(args.prompts)
        ]
        manager = RolloutManager([engine], tokenizer, check_template_drift=False)
        chat = ChatModel(model="lockstep", llm=engine, tokenizer=tokenizer)
        loop = asyncio.new_event_loop()
        ahead_side = f"async, {args.depth} in flight"
        timings: dict[str, list[float]] = {
            "rollout manager": [],
            "lockstep baseline": [],
            ahead_side: [],
            "async, tail carried": [],
        }
        compute: dict[str, list[float]] = {name: [] for name in timings}  # the engine's, per rollout or step
        for round_ in range(args.repeats + 1):
            start, busy = time.perf_counter(), engine.busy_seconds
            batch = manager.generate(rows, args.samples, PARAMS)
            managed, managed_busy = time.perf_counter() - start, engine.busy_seconds - busy
            assert batch.stats.num_failed == 0, batch.stats.failure_reasons
            start, busy = time.perf_counter(), engine.busy_seconds
            loop.run_until_complete(lockstep(chat, rows, args.samples))
            stepped, stepped_busy = time.perf_counter() - start, engine.busy_seconds - busy
            busy = engine.busy_seconds
            ahead = pipelined(manager, rows, args.samples, args.pipeline, args.depth)
            ahead_busy, busy = (engine.busy_seconds - busy) / args.pipeline, engine.busy_seconds
            carried = tail_carried(manager, rows, args.samples, args.pipeline)
            carried_busy = (engine.busy_seconds - busy) / args.pipeline
            if round_:
                for name, seconds, engine_seconds in (
                    ("rollout manager", managed, managed_busy),
                    ("lockstep baseline", stepped, stepped_busy),
                    (ahead_side, ahead, ahead_busy),
                    ("async, tail carried", carried, carried_busy),
                ):
                    timings[name].append(seconds)
                    compute[name].append(engine_seconds)
        manager.close()
        engine.shutdown()
    slow = sum(
        tool_latency(r, s, t) > 0.5 for r in range(args.prompts) for s in range(args.samples) for t in range(1, TURNS)
    )
    print(
        f"{args.latency} latency: {args.prompts} prompts x {args.samples} samples, {TURNS} model turns of {args.new_tokens} tokens, "
        f"engine {args.engine} ({args.dtype}, {args.device}), prefix cache {args.prefix_cache_mb:g} MB, {slow} tool calls over 0.5 s of "
        f"{args.prompts * args.samples * (TURNS - 1)}, {args.threads} threads, median of {args.repeats}"
    )
    medians = {k: statistics.median(v) for k, v in timings.items()}
    compute_medians = {k: statistics.median(v) for k, v in compute.items()}
    for name, seconds in medians.items():
        print(f"  {name:20s} {seconds:7.3f} s   (engine compute {compute_medians[name]:.3f} s)")
    managed, stepped, ahead, carried = medians.values()
    print(
        f"  manager / lockstep {managed / stepped:.2f} (target <= 0.6); async / lockstep {ahead / stepped:.2f}, "
        f"tail carried / lockstep {carried / stepped:.2f} (<= 0.5)"
    )
    # A schedule that spends the engine compute lockstep spends cannot take less wall time than that compute.
    print(
        f"  lockstep's engine compute / its wall time {compute_medians['lockstep baseline'] / stepped:.2f}: the compute floor"
    )


if __name__ == "__main__":
    main()
