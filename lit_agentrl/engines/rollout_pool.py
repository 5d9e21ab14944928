"""``lit-agentrl pool``: a rollout pool on GPUs of its own: SGLang servers (one per GPU group) behind SGLang's router,
and the discovery file a trainer's ``engine: {name: sglang_router, kwargs: {discovery_file: ...}}`` waits for.

Each server gets its GPUs through ``CUDA_VISIBLE_DEVICES``, a port of its own and a seed of its own, and runs with
``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0`` (the router's health probe must not generate through a scheduler busy
with a weight push). The router runs as docs/engines.md launches it. The discovery file is written, atomically, once
every server is healthy and the router lists them all as ready; the pool then runs until it is stopped (SIGTERM,
SIGINT), and stops everything it started and removes the file. A server that dies meanwhile is the router's and the
trainer's to handle (``engine: sglang_router`` names it, drops it and goes on).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lit_agentrl.engines.sglang_base import server_env
from lit_agentrl.engines.sglang_group import start_server, stop_server, wait_until_healthy

log = logging.getLogger(__name__)

ROUTER_FLAGS = [
    *("--policy", "consistent_hashing", "--enable-rl", "--disable-retries", "--remove-unhealthy-workers"),
    *("--health-check-interval-secs", "2", "--health-failure-threshold", "2"),
]
"""What the trainer's client needs of the router: sticky routing by key, its RL control plane, no silent retries."""


@dataclass(frozen=True)
class PoolSpec:
    """The servers and the router to start."""

    model_path: str
    gpu_groups: list[str]  # one CUDA_VISIBLE_DEVICES value per server ("" on CPU)
    host: str = "127.0.0.1"
    port: int = 30001  # the i-th server listens on port + i
    router_port: int = 31000
    seed: int = 0  # the i-th server samples with seed + i
    server_args: tuple[str, ...] = ()  # more sglang.launch_server options, for every server
    router_args: tuple[str, ...] = ()  # more smg launch options

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{self.port + i}" for i in range(len(self.gpu_groups))]

    @property
    def router_url(self) -> str:
        return f"http://{self.host}:{self.router_port}"


def server_command(spec: PoolSpec, index: int) -> list[str]:
    return [
        *(sys.executable, "-m", "sglang.launch_server", "--model-path", spec.model_path, "--skip-tokenizer-init"),
        *("--host", spec.host, "--port", str(spec.port + index), "--random-seed", str(spec.seed + index)),
        *spec.server_args,
    ]


def router_command(spec: PoolSpec, smg: str) -> list[str]:
    return [
        *(smg, "launch", "--host", spec.host, "--port", str(spec.router_port)),
        *("--prometheus-port", str(spec.router_port + 90), "--worker-urls", *spec.urls, *ROUTER_FLAGS),
        *spec.router_args,
    ]


@contextlib.contextmanager
def running_pool(spec: PoolSpec, discovery_file: Path, smg: str = "smg", timeout_s: float = 900.0) -> Iterator[None]:
    """The servers and the router, up and written to ``discovery_file``, until the block ends; all stopped after."""
    servers: list[subprocess.Popen] = []
    router: subprocess.Popen | None = None
    try:
        for index, gpus in enumerate(spec.gpu_groups):
            env = {**server_env(spec.model_path), "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = gpus
            servers.append(start_server(server_command(spec, index), env))
        for url, server in zip(spec.urls, servers):
            wait_until_healthy(url, server, timeout_s)
        router = subprocess.Popen(router_command(spec, smg), start_new_session=True)
        wait_until_routed(spec.router_url, spec.urls, router, timeout_s=60.0)
        write_discovery(discovery_file, {"router_url": spec.router_url, "urls": spec.urls})
        log.info("rollout pool up: router %s, servers %s; written to %s", spec.router_url, spec.urls, discovery_file)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            discovery_file.unlink()  # a trainer started later must not find a pool that is gone
        if router is not None:
            stop_tree(router)
        for server in servers:
            stop_server(server)


def wait_until_routed(router_url: str, urls: Sequence[str], router: subprocess.Popen, timeout_s: float) -> None:
    """Until the router lists every server as ready."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if router.poll() is not None:
            raise RuntimeError(f"SGLang's router exited with code {router.returncode} before it served {router_url}")
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            workers = httpx.get(f"{router_url}/workers", timeout=5).json()["workers"]
            if {w["url"] for w in workers if w["status"] == "ready"} >= set(urls):
                return
        time.sleep(0.5)
    raise TimeoutError(f"SGLang's router at {router_url} did not list {list(urls)} as ready within {timeout_s:.0f} s")


def write_discovery(path: Path, pool: dict[str, object]) -> None:
    """Atomically: a trainer polling for the file never reads half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(pool))
    partial.replace(path)


def stop_tree(process: subprocess.Popen) -> None:
    """Stop a process and every process it started (the router's launcher starts the router in a group of its own)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - the router extra installs it
        process.terminate()
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        family = [*psutil.Process(process.pid).children(recursive=True), psutil.Process(process.pid)]
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.terminate()
        _, alive = psutil.wait_procs(family, timeout=10)
        for member in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()


def pool_main(args: list[str]) -> int:
    """``lit-agentrl pool``: start the pool, write the discovery file, run until stopped."""
    parser = argparse.ArgumentParser(prog="lit-agentrl pool", description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True, help="the policy's starting weights, as the trainer's")
    parser.add_argument("--gpus", required=True, help="one GPU group per server: '4,5,6,7' or '4-5,6-7'; cpu:N on CPU")
    parser.add_argument("--discovery-file", type=Path, required=True, help="where the trainer reads the pool from")
    parser.add_argument("--host", default="127.0.0.1", help="the address the servers and the router listen on")
    parser.add_argument("--port", type=int, default=30001)
    parser.add_argument("--router-port", type=int, default=31000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smg", default=shutil.which("smg") or "smg", help="SGLang's router (pip install smg)")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="sglang.launch_server options for every server, as --server-arg='--dtype bfloat16'",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        help="smg launch options, as --router-arg='--disable-worker-overload-protection'",
    )
    ns = parser.parse_args(args)
    spec = PoolSpec(
        ns.model_path, gpu_groups(ns.gpus), ns.host, ns.port, ns.router_port, ns.seed,
        tuple(" ".join(ns.server_arg).split()), tuple(" ".join(ns.router_arg).split()),
    )  # fmt: skip
    stop = {"signal": 0}
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: stop.update(signal=number))
    with running_pool(spec, ns.discovery_file, ns.smg):
        print(json.dumps({"router_url": spec.router_url, "urls": spec.urls}), flush=True)
        while not stop["signal"]:
            time.sleep(0.5)
    return 0


def gpu_groups(text: str) -> list[str]:
    """``--gpus``: ``4,5,6,7`` (one GPU per server), ``4-5,6-7`` (two per server), or ``cpu:N`` (N CPU servers)."""
    if text.startswith("cpu:"):
        return [""] * int(text.removeprefix("cpu:"))
    groups = []
    for group in text.split(","):
        first, _, last = group.partition("-")
        groups.append(",".join(str(g) for g in range(int(first), int(last or first) + 1)))
    return groups


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(pool_main(sys.argv[1:]))
