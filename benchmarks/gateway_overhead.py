"""What the OpenAI-compatible gateway costs: the same 3-turn conversations through ChatModel directly and through
the official ``openai`` client and the gateway, side by side, over an engine that answers at once.

The engine does no compute (it returns a fixed 2-token reply with log-probs), so what is timed is everything around
a model call: encoding, the engine call, parsing, and for the gateway the client, HTTP on loopback, the server and
the session's token bookkeeping. Each round runs ``--trajectories`` conversations concurrently, as a rollout does,
both ways, alternating; the medians over the rounds are reported per model call and per trajectory.

    python benchmarks/gateway_overhead.py --rounds 7 --trajectories 128
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

from transformers import AutoTokenizer

from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.agents.gateway import Gateway
from lit_agentrl.context import TrajectoryContext, enter_trajectory
from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.models.tiny import TinyModelConfig, save_tiny_model

TURNS = 3
SAMPLING = {"max_new_tokens": 4, "temperature": 1.0}
PROMPT = [{"role": "user", "content": "guess"}]


class InstantEngine(RolloutEngine):
    """Answers every request at once with the same two tokens (a digit and the end of turn)."""

    def __init__(self, reply: list[int]) -> None:
        self.reply = reply

    async def async_generate(self, input_ids=None, sampling_params=None, return_logprob=False, **kwargs):
        await asyncio.sleep(0)
        meta: dict[str, Any] = {
            "finish_reason": {"type": "stop", "matched": self.reply[-1]},
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(self.reply),
        }
        if return_logprob:
            meta["output_token_logprobs"] = [(-0.1, t, None) for t in self.reply]
        return {"output_ids": list(self.reply), "meta_info": meta}

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        return True, ""

    def flush_cache(self) -> bool:
        return True


async def direct(chat: ChatModel, count: int) -> None:
    async def one() -> None:
        enter_trajectory(TrajectoryContext(sampling_params=SAMPLING))
        messages: list[Any] = list(PROMPT)
        for _ in range(TURNS):
            reply = await chat.ainvoke(messages)
            messages += [reply, {"role": "user", "content": "higher"}]

    await asyncio.gather(*(one() for _ in range(count)))


async def through_gateway(gateway: Gateway, count: int, http_client: Any = None) -> None:
    """What an agent function gets: the official client on the gateway's in-process HTTP client (unless given one)."""
    import openai

    async def one() -> None:
        session = gateway.open_session(TrajectoryContext(sampling_params=SAMPLING))
        client = openai.AsyncOpenAI(
            base_url=gateway.base_url(session),
            api_key="x",
            max_retries=0,
            http_client=http_client or gateway.http_client,
        )
        messages: list[dict[str, Any]] = list(PROMPT)
        for _ in range(TURNS):
            reply = await client.chat.completions.create(model="policy", messages=messages)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": "higher"},
            ]
        assert len(session.samples) == 1, "every turn must continue the first sample"
        gateway.close_session(session)

    await asyncio.gather(*(one() for _ in range(count)))


async def over_loopback(gateway: Gateway, count: int, http_client: Any) -> None:
    """What a client of its own gets (LangChain's ChatOpenAI, a separate program): the openai client over TCP to
    uvicorn, one HTTP client shared by the trajectories."""
    await through_gateway(gateway, count, http_client)


async def main(rounds: int, count: int) -> None:
    folder = tempfile.mkdtemp(prefix="lit-agentrl-gateway-bench-")
    save_tiny_model(folder, TinyModelConfig(tokenizer="words"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    engine = InstantEngine([*tokenizer.encode("5", add_special_tokens=False), tokenizer.eos_token_id])
    chat = ChatModel(model="policy", llm=engine, tokenizer=tokenizer)
    gateway = Gateway(chat)
    await gateway.start()
    import openai

    loopback = openai.DefaultAsyncHttpxClient(timeout=None)
    ways = {
        "direct": lambda: direct(chat, count),
        "gateway": lambda: through_gateway(gateway, count),
        "loopback": lambda: over_loopback(gateway, count, loopback),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for round_ in range(rounds + 1):  # the first round warms them up
            for name, run in ways.items():
                start = time.perf_counter()
                await run()
                if round_:
                    times[name].append(time.perf_counter() - start)
    finally:
        await loopback.aclose()
        await gateway.stop()
    calls = count * TURNS
    medians = {name: statistics.median(found) for name, found in times.items()}
    for name, median in medians.items():
        print(
            f"{name:8s} {median * 1e3:8.1f} ms per round of {count} trajectories: {median / calls * 1e3:.3f} ms per "
            f"call, {median / count * 1e3:.3f} ms per trajectory"
        )
    for name in ("gateway", "loopback"):
        extra = medians[name] - medians["direct"]
        print(
            f"{name} over direct: {extra / calls * 1e3:.3f} ms per call, {extra / count * 1e3:.3f} ms per trajectory"
            f" (target <= 2 ms per call with the openai client); ratio {medians[name] / medians['direct']:.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--trajectories", type=int, default=128)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.trajectories))
