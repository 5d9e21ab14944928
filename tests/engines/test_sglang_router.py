"""``engine: sglang_router``: two real SGLang CPU servers behind SGLang's real router (``smg``). Each trajectory's
calls stay on one server; a weight push over gloo groups reaches both (their greedy tokens equal the policy's), and so
does one through shared storage, each bucket written once for both; a server killed mid-request fails that request by
name, is dropped at the next push and removed from the router, and generation goes on with the other.

The router comes from ``scripts/build_router_env.sh`` (``LIT_AGENTRL_SMG`` names its ``smg``; CI builds it)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack

import httpx
import pytest
from support import (
    REPO_ROOT,
    SGLANG_SHIM,
    SMG,
    free_port,
    kill_tree,
    require_router,
    require_sglang,
    sglang_server,
    smg_router,
)
from test_collective_transport import perturbed
from test_disk_transport import GREEDY, PROMPT, reference

from lit_agentrl.context import TrajectoryContext, enter_trajectory
from lit_agentrl.errors import UserInputError

LONG = {"temperature": 0.0, "max_new_tokens": 1500, "ignore_eos": True}


async def in_trajectory(engine, context: TrajectoryContext, params: dict = GREEDY) -> list[int]:
    enter_trajectory(context)
    return (await engine.async_generate(input_ids=PROMPT, sampling_params=params))["output_ids"]


@pytest.mark.sglang
def test_sticky_routing_pushes_to_every_server_and_a_dead_server_is_named_then_dropped(tiny_model_dir, tmp_path):
    from lit_agentrl.bridge.weights import sync_weights
    from lit_agentrl.engines.sglang_router import NoRolloutServers, RolloutServerDied, SGLangRouterEngine

    require_sglang()
    require_router()
    with ExitStack() as stack:
        (url_a, process_a), (url_b, process_b) = (stack.enter_context(sglang_server(tiny_model_dir)) for _ in range(2))
        front = stack.enter_context(smg_router([url_a, url_b]))
        with pytest.raises(UserInputError, match=r"not the servers the router .* routes to"):
            SGLangRouterEngine(front, str(tiny_model_dir), urls=[url_a])
        engine = SGLangRouterEngine(front, str(tiny_model_dir), transport="collective", collective_backend="gloo")
        stack.callback(engine.shutdown)
        trajectories: list[TrajectoryContext] = []

        async def turns(batch: list[TrajectoryContext]) -> None:  # three calls of each trajectory, side by side
            for _ in range(3):
                await asyncio.gather(*(asyncio.create_task(in_trajectory(engine, t)) for t in batch))

        # The hash ring need not split keys evenly between two servers (one CI run put 8 keys on one), so trajectories
        # come in batches of 8 until both have served one: 64 keys miss a server that owns 10% of the ring 1 in 800.
        while len({engine.served_by(t.route_key) for t in trajectories}) < 2 and len(trajectories) < 64:
            batch = [TrajectoryContext() for _ in range(8)]
            asyncio.run(turns(batch))
            trajectories += batch
        served = {t.route_key: engine.served_by(t.route_key) for t in trajectories}
        assert set(served.values()) == {url_a, url_b}
        assert engine.moved_trajectories == 0  # every call of a trajectory on its first server

        updated = perturbed(tiny_model_dir, 1)
        sync_weights(updated, [engine], bucket_bytes=64 << 10, weight_version=1)
        outputs = asyncio.run(_each(engine, trajectories))
        assert all(tokens == reference(updated) for tokens in outputs)  # each server has the new weights

        disk = SGLangRouterEngine(front, str(tiny_model_dir), transport="disk", weights_dir=str(tmp_path / "w"))
        updated = perturbed(tiny_model_dir, 3)
        sync_weights(updated, [disk], bucket_bytes=64 << 10, weight_version=3)  # each bucket written once
        assert all(tokens == reference(updated) for tokens in asyncio.run(_each(disk, trajectories)))
        assert list((tmp_path / "w").iterdir()) == []
        disk.shutdown()

        doomed = next(t for t in trajectories if served[t.route_key] == url_a)

        async def killed_mid_request() -> None:
            request = asyncio.create_task(in_trajectory(engine, doomed, LONG))
            await asyncio.sleep(2.0)
            kill_tree(process_a.pid)
            await request

        with pytest.raises(RolloutServerDied, match="died during the request"):
            asyncio.run(killed_mid_request())
        sync_weights(perturbed(tiny_model_dir, 2), [engine], bucket_bytes=64 << 10, weight_version=2)
        assert [s.url for s in engine.servers] == [url_b]  # dropped at the push, and from the router:
        assert routed_after_removal(front) == [url_b]
        assert asyncio.run(in_trajectory(engine, doomed)) == reference(perturbed(tiny_model_dir, 2))
        assert engine.moved_trajectories >= 1
        kill_tree(process_b.pid)
        with pytest.raises(NoRolloutServers, match="every rollout server behind the router"):
            engine.flush_cache()


def routed_after_removal(front: str, within_s: float = 20.0) -> list[str]:
    """The router's servers once a queued removal has taken effect (it answers 202 and removes within seconds)."""
    deadline = time.monotonic() + within_s
    while True:
        urls = [w["url"] for w in httpx.get(f"{front}/workers").json()["workers"]]
        if len(urls) < 2 or time.monotonic() > deadline:
            return urls
        time.sleep(0.5)


async def _each(engine, trajectories: list[TrajectoryContext]) -> list[list[int]]:
    return await asyncio.gather(*(asyncio.create_task(in_trajectory(engine, t)) for t in trajectories))


@pytest.mark.sglang
def test_lit_agentrl_pool_starts_the_servers_and_router_a_trainer_finds_by_its_discovery_file(tiny_model_dir, tmp_path):
    from lit_agentrl.engines.sglang_router import SGLangRouterEngine

    require_sglang()
    require_router()
    discovery = tmp_path / "pool.json"
    cpu = "--device cpu --attention-backend torch_native --dtype float32 --max-total-tokens 4096 "
    cpu += "--mem-fraction-static 0.05 --log-level warning"
    command = [sys.executable, "-m", "lit_agentrl.cli", "pool", "--model-path", str(tiny_model_dir), "--gpus", "cpu:2"]
    command += ["--port", str(free_port()), "--router-port", str(free_port()), "--smg", str(SMG)]
    command += ["--discovery-file", str(discovery), f"--server-arg={cpu}"]
    command += ["--router-arg=--disable-worker-overload-protection"]
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": f"{SGLANG_SHIM}{os.pathsep}{REPO_ROOT}"}
    pool = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        (engine,) = SGLangRouterEngine.build(
            str(tiny_model_dir), discovery_file=str(discovery), discovery_timeout_s=600
        )
        try:
            assert len(engine.servers) == 2
            tokens = asyncio.run(in_trajectory(engine, TrajectoryContext()))
            assert len(tokens) == GREEDY["max_new_tokens"]
        finally:
            engine.shutdown()
    finally:
        pool.send_signal(signal.SIGTERM)
        _, err = pool.communicate(timeout=120)
    assert pool.returncode == 0, err[-3000:]
    assert not discovery.exists()  # a pool that is gone is not found by a later trainer
    for url in engine_urls(engine):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=5)


def engine_urls(engine) -> list[str]:
    return [engine.url, *(server.url for server in engine.servers)]
