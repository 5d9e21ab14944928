"""``engine: sglang_router``: two real SGLang CPU servers behind SGLang's real router (``smg``). Each trajectory's
calls stay on one server; a weight push over gloo groups reaches both (their greedy tokens equal the policy's); a
server killed mid-request fails that request by name, is dropped at the next push and removed from the router, and
generation goes on with the other.

The router comes from ``scripts/build_router_env.sh`` (``LIT_AGENTRL_SMG`` names its ``smg``; CI builds it)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import httpx
import pytest
from support import free_port, require_sglang, start_http_server, stop_server
from test_collective_transport import perturbed
from test_disk_transport import GREEDY, PROMPT, reference

from lit_agentrl.context import TrajectoryContext, enter_trajectory
from lit_agentrl.errors import UserInputError

SMG = Path(os.environ.get("LIT_AGENTRL_SMG", Path.home() / ".cache/lit-agentrl/router-venv/bin/smg"))
LONG = {"temperature": 0.0, "max_new_tokens": 1500, "ignore_eos": True}


def require_router() -> None:
    if not SMG.exists():
        if os.environ.get("LIT_AGENTRL_REQUIRE_SGLANG") == "1":
            pytest.fail(f"SGLang's router is not at {SMG} (scripts/build_router_env.sh builds it)")
        pytest.skip(f"SGLang's router is not at {SMG}; scripts/build_router_env.sh builds it")


def kill_tree(pid: int) -> None:
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for process in [*root.children(recursive=True), root]:
        with suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)


@contextmanager
def server(model_dir: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    from lit_agentrl.engines.sglang_group import wait_until_healthy

    port = free_port()
    process = start_http_server(model_dir, port)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout_s=600)
        yield f"http://127.0.0.1:{port}", process
    finally:
        kill_tree(process.pid) if process.poll() is None else None
        stop_server(process)


@contextmanager
def router(urls: list[str]) -> Iterator[str]:
    """``smg`` as docs/engines.md launches it, ready once it lists every server as ready."""
    port, metrics = free_port(), free_port()
    command = [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(metrics)]
    command += ["--worker-urls", *urls, "--policy", "consistent_hashing", "--enable-rl", "--disable-retries"]
    command += ["--disable-worker-overload-protection", "--health-check-interval-secs", "2"]
    command += ["--health-failure-threshold", "2", "--remove-unhealthy-workers"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                workers = httpx.get(f"{url}/workers").json()["workers"]
                if len(workers) == len(urls) and all(w["status"] == "ready" for w in workers):
                    break
            except (httpx.TransportError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the router at {url} did not list {urls} as ready within 60 s")
        yield url
    finally:
        kill_tree(process.pid)


async def in_trajectory(engine, context: TrajectoryContext, params: dict = GREEDY) -> list[int]:
    enter_trajectory(context)
    return (await engine.async_generate(input_ids=PROMPT, sampling_params=params))["output_ids"]


@pytest.mark.sglang
def test_sticky_routing_pushes_to_every_server_and_a_dead_server_is_named_then_dropped(tiny_model_dir):
    from lit_agentrl.bridge.weights import sync_weights
    from lit_agentrl.engines.sglang_router import NoRolloutServers, RolloutServerDied, SGLangRouterEngine

    require_sglang()
    require_router()
    with ExitStack() as stack:
        (url_a, process_a), (url_b, process_b) = (stack.enter_context(server(tiny_model_dir)) for _ in range(2))
        front = stack.enter_context(router([url_a, url_b]))
        with pytest.raises(UserInputError, match=r"not the servers the router .* routes to"):
            SGLangRouterEngine(front, str(tiny_model_dir), urls=[url_a])
        engine = SGLangRouterEngine(front, str(tiny_model_dir), transport="collective", collective_backend="gloo")
        stack.callback(engine.shutdown)
        trajectories = [TrajectoryContext() for _ in range(8)]

        async def turns() -> None:  # three calls of each trajectory, side by side
            for _ in range(3):
                await asyncio.gather(*(asyncio.create_task(in_trajectory(engine, t)) for t in trajectories))

        asyncio.run(turns())
        served = {t.route_key: engine.served_by(t.route_key) for t in trajectories}
        assert set(served.values()) == {url_a, url_b}  # both used: 2^-7 odds against, by hashing 8 keys
        assert engine.moved_trajectories == 0  # every call of a trajectory on its first server

        updated = perturbed(tiny_model_dir, 1)
        sync_weights(updated, [engine], bucket_bytes=64 << 10, weight_version=1)
        outputs = asyncio.run(_each(engine, trajectories))
        assert all(tokens == reference(updated) for tokens in outputs)  # each server has the new weights

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
