"""What the SGLang engines send SGLang, checked here without SGLang (it runs in its own environment): the in-process
engine over a stand-in for ``sglang.Engine`` that records each ``generate`` call, and the HTTP engine over a stand-in
server (``httpx.MockTransport``). Mocks, since SGLang cannot run here; ``test_sglang_abort.py`` runs the same paths
against SGLang itself in CI's SGLang stage.

Each request carries an ``rid`` of ours and a ``sampling_seed`` from its sampling stream (the trajectory's seed and
request count), ``n`` is expanded into single requests, a cancelled HTTP call sends ``/abort_request`` for every one of
its requests, and a prompt past SGLang's context length is refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from lit_agentrl.context import TrajectoryContext, TrajectoryTag, enter_trajectory
from lit_agentrl.engines import PromptTooLongError
from lit_agentrl.engines.admission import AdmissionGate
from lit_agentrl.engines.sglang import SGLangEngine, SGLangHTTPEngine

SAMPLED = {"temperature": 1.0, "max_new_tokens": 3}


class StandInSGLangEngine(SGLangEngine):
    """:class:`SGLangEngine` over a stand-in that records the calls."""

    def _launch(self, **server_args: Any) -> Any:
        self.sent: list[dict[str, Any]] = []

        async def async_generate(**kwargs: Any) -> Any:
            self.sent.append(kwargs)
            rids = kwargs["rid"] if isinstance(kwargs["rid"], list) else [kwargs["rid"]]
            results = [{"output_ids": [], "meta_info": {"id": rid}} for rid in rids]
            return results if isinstance(kwargs["rid"], list) else results[0]

        manager = SimpleNamespace(context_len=server_args.get("context_length", 64))
        return SimpleNamespace(
            loop=None, async_generate=async_generate, shutdown=lambda: None, tokenizer_manager=manager
        )


class StandInServer:
    """An SGLang server's endpoints as the HTTP engine uses them: ``/generate`` holds every request until its client
    gives up; ``/abort_request`` records the ids it is sent."""

    def __init__(self) -> None:
        self.generating = asyncio.Event()
        self.aborted: list[str] = []
        self.transport = httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": 64}]})
        if request.url.path == "/get_server_info":
            return httpx.Response(200, json={"enable_deterministic_inference": False})
        if request.url.path == "/abort_request":
            self.aborted.append(json.loads(request.content)["rid"])
            return httpx.Response(200)
        assert request.url.path == "/generate", request.url.path
        self.generating.set()
        await asyncio.Event().wait()  # until the client is cancelled
        raise AssertionError("unreachable")


class StandInHTTPEngine(SGLangHTTPEngine):
    """:class:`SGLangHTTPEngine` whose client reaches a :class:`StandInServer`."""

    def __init__(self, server: StandInServer, model_path: str) -> None:
        super().__init__("http://stand-in", model_path)
        self.server = server

    def _client(self) -> Any:
        return httpx.AsyncClient(base_url=self.url, transport=self.server.transport)


@pytest.fixture
def stand_in(tiny_model_dir):
    return StandInSGLangEngine(str(tiny_model_dir), seed=7)


def seeds(calls: list[dict[str, Any]]) -> list[int]:
    params = [
        p
        for call in calls
        for p in (call["sampling_params"] if isinstance(call["sampling_params"], list) else [call["sampling_params"]])
    ]
    return [p["sampling_seed"] for p in params]


def rollout(engine: StandInSGLangEngine, seed: int) -> list[int]:
    """Two trajectories of two turns each, as a rollout manager runs them; the seeds their requests carried."""
    gate = AdmissionGate([[(0, 0), (0, 1)]], capacity=2)

    async def trajectory(key: tuple[int, int]) -> None:
        enter_trajectory(TrajectoryContext(TrajectoryTag(gate, key, seed)))
        for _ in range(2):
            await engine.async_generate(input_ids=[5, 6, 7], sampling_params=SAMPLED)

    async def both() -> None:
        for key in [(0, 0), (0, 1)]:
            await asyncio.create_task(trajectory(key))

    engine.sent.clear()
    asyncio.run(both())
    return seeds(engine.sent)


def test_a_repeated_rollout_sends_the_same_seeds_and_no_two_requests_share_one(stand_in):
    first = rollout(stand_in, seed=11)
    assert rollout(stand_in, seed=11) == first
    assert len(set(first)) == 4  # two turns of a trajectory, or two trajectories, never share a seed
    assert not set(rollout(stand_in, seed=12)) & set(first)
    assert all(0 <= s < 2**63 for s in first)  # SGLang's range


def test_untagged_requests_follow_the_reseeds_and_an_own_seed_wins(stand_in):
    def untagged(params: dict[str, Any]) -> list[int]:
        stand_in.sent.clear()
        asyncio.run(stand_in.async_generate(input_ids=[[5, 6], [7, 8]], sampling_params=params))
        return seeds(stand_in.sent)

    stand_in.reseed(3)
    once = untagged(SAMPLED)
    stand_in.reseed(3)
    assert untagged(SAMPLED) == once and len(set(once)) == 2
    assert untagged({**SAMPLED, "sampling_seed": 99}) == [99, 99]


def test_n_samples_become_single_requests_each_with_its_id_and_seed(stand_in):
    results = asyncio.run(stand_in.async_generate(input_ids=[5, 6], sampling_params={**SAMPLED, "n": 3}))
    (call,) = stand_in.sent
    assert call["input_ids"] == [[5, 6]] * 3 and all("n" not in p for p in call["sampling_params"])
    assert len(set(call["rid"])) == 3 and len(set(seeds([call]))) == 3
    assert [r["meta_info"]["id"] for r in results] == call["rid"]
    with pytest.raises(ValueError, match="rid is set by the engine"):
        asyncio.run(stand_in.async_generate(input_ids=[5, 6], rid="mine"))


def test_a_cancelled_http_call_aborts_every_one_of_its_requests_on_the_server(tiny_model_dir):
    server = StandInServer()
    engine = StandInHTTPEngine(server, str(tiny_model_dir))

    async def cancelled() -> None:
        call = asyncio.ensure_future(engine.async_generate(input_ids=[5, 6], sampling_params={**SAMPLED, "n": 2}))
        await server.generating.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(cancelled())
    assert len(set(server.aborted)) == 2 and all(rid.startswith("lit-agentrl-") for rid in server.aborted)
    assert engine.context_length == 64  # read from the server's /v1/models at the first request


def test_a_prompt_past_sglangs_context_is_refused_before_it_is_sent(tiny_model_dir):
    engine = StandInSGLangEngine(str(tiny_model_dir), context_length=8)
    assert engine.context_length == 8
    with pytest.raises(PromptTooLongError, match="the prompt has 8 tokens, and the engine's context length is 8"):
        asyncio.run(engine.async_generate(input_ids=list(range(8))))
    with pytest.raises(PromptTooLongError, match="max_new_tokens is 4"):
        asyncio.run(engine.async_generate(input_ids=list(range(5)), sampling_params={"max_new_tokens": 4}))
    assert engine.sent == []
