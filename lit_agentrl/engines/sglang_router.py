"""SGLang servers behind SGLang's router (``engine: sglang_router``), on GPUs or nodes of their own.

The router is the Shepherd Model Gateway (``smg``, which SGLang 0.5.23 reads the routing header of and documents as
its router, formerly ``sglang-router``). Generation goes through it, each trajectory's calls on one server: every
request bears the trajectory's :attr:`~lit_agentrl.context.TrajectoryContext.route_key` as ``X-SMG-Routing-Key``,
which ``--policy consistent_hashing`` keeps on one worker (its prefix cache serves the next turn). The trainer updates
the servers itself, one :class:`~lit_agentrl.engines.sglang_http.SGLangHTTPEngine` client per server with the weight
transport of ``engine.kwargs.transport`` (inline, a collective group per server, or disk: one file per bucket that
every server loads): pauses, sessions, pushes, cache flushes, adapters and aborts go to every live server.

The router must run with ``--disable-retries``: otherwise it silently re-runs a request whose server died on another
one (HTTP 200, a turn restarted). A server that dies mid-rollout then fails the trajectories whose requests it held,
named (:class:`RolloutServerDied`, counted among the rollout's failure reasons); a server that stops answering the
trainer is dropped from the pool and removed from the router, so no request reaches weights that missed a push; the
run goes on with the rest, and stops naming the router and the servers when none is left (:class:`NoRolloutServers`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from lit_agentrl.context import current_trajectory
from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.engines.registry import register_engine
from lit_agentrl.engines.sglang_http import SGLangHTTPEngine
from lit_agentrl.engines.weight_files import bucket_folder
from lit_agentrl.errors import UserInputError

log = logging.getLogger(__name__)

ROUTING_KEY = "X-SMG-Routing-Key"
ROUTED_WORKER = "x-smg-routed-worker-id"
"""The router's answer header naming the server that served a request."""
RECENT_ROUTES = 4096
ERROR_CODE = "x-smg-error-code"
SERVER_GONE = ("call_upstream_connection_failed", "call_upstream_request_error")
"""The router's error codes for a server that died: before the request reached it, or while it ran."""


DISCOVERY_TIMEOUT_S = 600.0
"""How long the trainer waits for a launcher's discovery file (servers take minutes to load a large model)."""


def read_discovery(path: str, timeout_s: float = DISCOVERY_TIMEOUT_S) -> dict[str, Any]:
    """The router's URL and its servers' from the JSON file a launcher writes once they are up
    (``{"router_url": "http://...", "urls": ["http://...", ...]}``), waiting up to ``timeout_s`` for it to appear."""
    file = Path(path)
    deadline = time.monotonic() + timeout_s
    while not file.exists():
        if time.monotonic() > deadline:
            raise UserInputError(
                f"engine.kwargs.discovery_file {path!r} did not appear within {timeout_s:.0f} s: start the rollout "
                "pool's launcher first, or set engine.kwargs.discovery_timeout_s"
            )
        time.sleep(1.0)
    try:
        found = json.loads(file.read_text())
    except ValueError as exc:
        raise UserInputError(f"engine.kwargs.discovery_file {path!r} is not JSON: {exc}") from None
    if not isinstance(found, dict) or not isinstance(found.get("router_url"), str):
        raise UserInputError(f'engine.kwargs.discovery_file {path!r} must hold {{"router_url": URL, "urls": [...]}}')
    urls = found.get("urls")
    if urls is not None and not (isinstance(urls, list) and all(isinstance(u, str) for u in urls)):
        raise UserInputError(f"engine.kwargs.discovery_file {path!r}: 'urls' must be a list of URLs, got {urls!r}")
    return {"router_url": found["router_url"], **({"urls": urls} if urls else {})}


class RolloutServerDied(RuntimeError):
    """A request's server died while it ran (the router's ``call_upstream_connection_failed``)."""


class NoRolloutServers(RuntimeError):
    """No server is left behind the router."""


@register_engine("sglang_router")
class SGLangRouterEngine(SGLangHTTPEngine):
    """SGLang servers behind SGLang's router.

    Args:
        router_url: the router, e.g. ``http://10.0.0.5:30000`` (``smg launch --policy consistent_hashing
            --disable-retries --enable-rl ...``; the launch line is in docs/engines.md). ``engine.kwargs`` may name
            a ``discovery_file`` instead (:func:`read_discovery`), waited for up to ``discovery_timeout_s``.
        model_path: the policy's path (its weight names and shapes, checked before each push).
        urls: the servers behind the router, as the router knows them; None: the router's own list (``/workers``).
            Either way they must be exactly the router's: a server the router routes to and the trainer does not
            update would serve stale weights.
        timeout_s: per-request timeout (generation, and every control call to a server).
        owner: whether this rank updates the servers (rank 0).
        seed: the seed of the requests' sampling streams until the first :meth:`reseed`.
        **server_kwargs: each server's client's (:class:`SGLangHTTPEngine`): ``transport``, ``weights_dir``,
            ``collective_backend``, ``collective_address``, ``collective_port``, ``tp_size``.
    """

    @classmethod
    def build(
        cls, model_path: str, seed: int = 0, placement: EnginePlacement | None = None, **kwargs: Any
    ) -> list[RolloutEngine]:
        """One client of the router, shared by every rank; rank 0 updates the servers."""
        discovery = kwargs.pop("discovery_file", None)
        timeout_s = float(kwargs.pop("discovery_timeout_s", DISCOVERY_TIMEOUT_S))
        if discovery is not None:  # urls the config lists stay: the router must route to exactly those
            kwargs = {**read_discovery(discovery, timeout_s), **kwargs}
        router_url = kwargs.pop("router_url", None)
        if not router_url:
            raise UserInputError(
                "engine 'sglang_router' needs engine.kwargs.router_url (the URL of SGLang's router) or "
                "engine.kwargs.discovery_file (a JSON file a launcher writes: {router_url, urls})"
            )
        owner = placement is None or placement.global_rank == 0
        return [cls(router_url, model_path, owner=owner, seed=seed, **kwargs)]

    def __init__(
        self,
        router_url: str,
        model_path: str,
        urls: list[str] | None = None,
        timeout_s: float = 600.0,
        owner: bool = True,
        seed: int = 0,
        **server_kwargs: Any,
    ) -> None:
        super().__init__(router_url, model_path, timeout_s=timeout_s, owner=owner, seed=seed)
        routed = self._router_workers()
        urls = [url.rstrip("/") for url in urls] if urls else sorted(routed)
        if set(urls) != set(routed):
            raise UserInputError(
                f"engine.kwargs.urls {urls} are not the servers the router at {self.url} routes to {sorted(routed)}: "
                "a server the trainer does not update would serve stale weights (leave urls out to take the router's)"
            )
        if not urls:
            raise UserInputError(f"the router at {self.url} has no servers (smg launch --worker-urls ...)")
        self.servers = [
            SGLangHTTPEngine(url, model_path, timeout_s=timeout_s, owner=owner, seed=seed, **server_kwargs)
            for url in urls
        ]
        self._routes: OrderedDict[str, str] = OrderedDict()
        self.moved_trajectories = 0
        """Trajectories whose calls the router sent to another server than their earlier ones."""

    # ------------------------------------------------------------------ the router

    def _router_workers(self) -> dict[str, str]:
        """The router's servers: URL -> its worker id."""
        response = self._sync.get("/workers")
        response.raise_for_status()
        return {entry["url"].rstrip("/"): entry["id"] for entry in response.json().get("workers", [])}

    def _route_headers(self, rids: list[str]) -> dict[str, str]:
        trajectory = current_trajectory()
        return {ROUTING_KEY: trajectory.route_key if trajectory is not None else rids[0]}

    def _check_generated(self, response: Any) -> None:
        if response.status_code < 400:
            self._note_route(response.request.headers.get(ROUTING_KEY), response.headers.get(ROUTED_WORKER))
            return
        try:
            error = response.json().get("error", {})
        except ValueError:
            error = {}
        code, message = error.get("code"), error.get("message") or response.text[:300]
        if code in SERVER_GONE:
            raise RolloutServerDied(f"a rollout server behind the router {self.url} died during the request: {message}")
        if code == "no_available_workers":
            raise NoRolloutServers(f"no rollout server is left behind the router {self.url}: {message}")
        raise RuntimeError(
            f"the router {self.url} answered HTTP {response.status_code} ({response.headers.get(ERROR_CODE)}): "
            f"{response.text[:500]}"
        )

    def _note_route(self, key: str | None, server: str | None) -> None:
        """Remember the server of each recent trajectory; one that moves (its server died or left) is logged."""
        if key is None or server is None:
            return
        before = self._routes.pop(key, None)
        if before is not None and before != server:
            self.moved_trajectories += 1
            log.warning("a trajectory moved from rollout server %s to %s (its prefix cache is lost)", before, server)
        self._routes[key] = server
        while len(self._routes) > RECENT_ROUTES:
            self._routes.popitem(last=False)

    def served_by(self, route_key: str) -> str | None:
        """The server that answered the last request bearing ``route_key`` (among the recent ones)."""
        return self._routes.get(route_key)

    # ------------------------------------------------------------------ the servers

    def _live(self) -> list[SGLangHTTPEngine]:
        if not self.servers:
            raise NoRolloutServers(f"every rollout server behind the router {self.url} has been dropped")
        return list(self.servers)

    def _drop(self, server: SGLangHTTPEngine, error: BaseException) -> None:
        """Leave a server that stopped answering out of the pool, and out of the router's (it missed a push)."""
        log.error("rollout server %s stopped answering (%r): dropped from the pool and the router", server.url, error)
        self.servers.remove(server)
        worker_id = self._router_workers().get(server.url)
        if worker_id is not None:
            self._sync.delete(f"/workers/{worker_id}")
        server.shutdown()

    def _each(self, what: str, call: Any) -> dict[str, Any]:
        """``call(server)`` on every live server; SGLang-style answer: success when all succeeded."""
        import httpx

        failures = []
        for server in self._live():
            try:
                answer = call(server)
            except httpx.TransportError as exc:
                self._drop(server, exc)
                continue
            ok = answer.get("success", True) if isinstance(answer, dict) else True
            if not ok:
                failures.append(f"{server.url}: {answer.get('message')}")
        self._live()  # none left: say so
        return {"success": not failures, "message": "; ".join(failures) or f"{what}: every server"}

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._each(path, lambda server: server._post(path, body))

    def _push(self, pairs: list[tuple[str, torch.Tensor]], load_format: str | None, flush_cache: bool) -> Any:
        """Each server's push over its transport; through shared storage, one file that every server loads."""
        weights_dir = self.servers[0].weights_dir if self.servers else None
        if weights_dir is None or load_format is not None:
            return self._each("weights", lambda server: server._push(pairs, load_format, flush_cache))
        with bucket_folder(weights_dir, pairs) as folder:
            return self._each("weights", lambda server: server._load_folder(folder, flush_cache))

    async def abort(self, rids: list[str]) -> None:
        """Abort ``rids`` on every live server (a server that does not hold one answers 200); a server that cannot be
        reached is logged, the others still aborted."""
        servers = self._live()
        results = await asyncio.gather(*(server.abort(rids) for server in servers), return_exceptions=True)
        for server, result in zip(servers, results):
            if isinstance(result, BaseException):
                log.warning("could not abort requests on rollout server %s: %r", server.url, result)

    def _server_info(self) -> dict[str, Any]:
        return self._live()[0]._server_info()

    async def _read_facts(self) -> None:
        """The first server's (the router's ``/v1/models`` leaves the context length out)."""
        first = self._live()[0]
        if not first._facts_read:
            await first._read_facts()
        self._context_length, self._facts_read = first._context_length, True

    @property
    def context_length(self) -> int | None:  # type: ignore[override]
        if not self._facts_read:
            first = self._live()[0]
            self._context_length, self._facts_read = first.context_length, True
        return self._context_length

    @property
    def weight_dtype(self) -> torch.dtype | None:  # type: ignore[override]
        return self._live()[0].weight_dtype

    def lora_serving_problem(self, lora: Any) -> str | None:
        return next((p for server in self._live() if (p := server.lora_serving_problem(lora))), None)

    def shutdown(self) -> None:
        for server in self.servers:
            server.shutdown()
        super().shutdown()
