"""``openenv``: Meta's OpenEnv environments, in process or over their server, trained as they are.

OpenEnv environments are typed: an ``Environment`` (``reset(**kwargs)``, ``step(action)`` returning an
``Observation`` with ``reward`` and ``done``) served by ``create_app`` and reached by the environment's own
``EnvClient`` (async, over a WebSocket; ``StepResult(observation, reward, done)``). The agent YAML names them:

- ``environment: "pkg.server.my_environment:MyEnvironment"``: one instance per trajectory, in this process; or
  ``client: "pkg.client:MyEnv"`` with ``base_url: http://host:8000``: one session per trajectory on a running server
  (``uvicorn pkg.server.app:app``, or the environment's Docker image);
- ``action: "pkg.models:MyAction"`` and ``action_field``: the model turn's text becomes ``MyAction(**{action_field:
  text})``;
- ``max_sessions`` (with ``client``): the server's ``max_concurrent_envs`` (its ``create_app`` argument; OpenEnv's
  template serves 1), so trajectories wait for a session rather than have the server close theirs;
- ``observation_field`` (optional): the observation's field shown to the model as the next user turn (default: every
  field but ``reward``, ``done`` and ``metadata``, as JSON); ``max_turns`` (default 8) caps an episode that never ends.

A row may carry ``reset_kwargs`` (a mapping, passed to ``reset``: a task id, a seed). Each step's ``reward`` is its
turn's (``turn_rewards``); ``None`` counts as 0. In-process calls run in a worker thread (environments may block).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import Mapping
from typing import Any

from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.environment import Environment, register_environment
from lit_agentrl.agents.libraries.imports import import_object, library_problem, require

__all__ = ["OpenEnvEnvironment"]

AGENT = "openenv"
EXTRA = "openenv"
_USER = f"agent {AGENT!r}"
_NOT_SHOWN = frozenset({"reward", "done", "metadata"})


@register_environment(AGENT)
class OpenEnvEnvironment(Environment):
    """One episode of the OpenEnv environment the agent YAML names."""

    async def reset(self, row: dict[str, Any]) -> str:
        require("openenv", extra=EXTRA, user=_USER)
        self.action_class = _class(self._setting("action"), "action")
        self.action_field = str(self._setting("action_field"))
        kwargs = dict(row.get("reset_kwargs") or {})
        if cfg_get(self.cfg, "environment", None) is not None:
            self.env = _class(self._setting("environment"), "environment")()
            self.client = None
            return self._shown(await asyncio.to_thread(self.env.reset, **kwargs))
        client_class, url = _class(self._setting("client"), "client"), str(self._setting("base_url"))
        self.session = _sessions(asyncio.get_running_loop(), url, cfg_get(self.cfg, "max_sessions", None))
        await self.session.acquire()
        self.client, first = await _session(client_class, url, kwargs)
        return self._shown(first.observation)

    async def step(self, action: str) -> tuple[str, float, bool]:
        typed = self.action_class(**{self.action_field: action})
        if self.client is None:
            observation = await asyncio.to_thread(self.env.step, typed)
            reward, done = observation.reward, observation.done
        else:
            result = await self.client.step(typed)
            observation, reward, done = result.observation, result.reward, result.done
        return self._shown(observation), float(reward or 0.0), bool(done)

    async def close(self) -> None:
        client = getattr(self, "client", None)
        try:
            if client is not None:
                await client.close()
            elif hasattr(self, "env") and hasattr(self.env, "close"):
                await asyncio.to_thread(self.env.close)
        finally:
            if hasattr(self, "session"):
                self.session.release()

    def _shown(self, observation: Any) -> str:
        field = cfg_get(self.cfg, "observation_field", None)
        if field is not None:
            return str(getattr(observation, str(field)))
        shown = {k: v for k, v in observation.model_dump().items() if k not in _NOT_SHOWN}
        return json.dumps(shown, default=str)

    def _setting(self, key: str) -> Any:
        value = cfg_get(self.cfg, key, None)
        if value is None:
            raise ValueError(f"{_USER}: its agent YAML needs {key!r} ({_NEEDS})")
        return value

    @classmethod
    def row_errors(cls, row: Mapping[str, Any]) -> list[str]:
        problem = library_problem("openenv", extra=EXTRA, user=_USER)
        if problem:
            return [problem]
        kwargs = row.get("reset_kwargs")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            return [f"field 'reset_kwargs' must be a mapping of reset()'s arguments, got {kwargs!r}"]
        return []


_NEEDS = (
    "environment: 'module:Class' (in process) or client: 'module:Class' with base_url; action: 'module:Class' and "
    "action_field"
)


SESSION_WAIT_S = 60.0
"""How long a trajectory retries a server at capacity (it frees a closed session a moment after the client leaves)."""


async def _session(client_class: Any, url: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """A connected client and its ``reset(**kwargs)`` result; retried while the server is at capacity, for
    ``SESSION_WAIT_S``."""
    deadline, delay = time.monotonic() + SESSION_WAIT_S, 0.05
    while True:
        client = client_class(base_url=url)
        try:
            await client.connect()
            return client, await client.reset(**kwargs)  # claims the session: a server at capacity refuses here
        except Exception as exc:
            await _quietly_closed(client)
            if time.monotonic() + delay > deadline:
                raise RuntimeError(
                    f"{_USER}: the OpenEnv server at {url} gave no session within {SESSION_WAIT_S:.0f} s "
                    f"({type(exc).__name__}: {exc}); a server refuses sessions past its max_concurrent_envs: set "
                    "max_sessions in the agent YAML to match"
                ) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def _quietly_closed(client: Any) -> None:
    try:
        await client.close()
    except Exception:  # the connection is already gone
        return


_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _sessions(loop: asyncio.AbstractEventLoop, url: str, limit: int | None) -> asyncio.Semaphore:
    """The sessions a server grants at once, shared by this loop's trajectories (unbounded without a limit)."""
    per_url = _SESSIONS.setdefault(loop, {})
    if url not in per_url:
        per_url[url] = asyncio.Semaphore(int(limit) if limit else 1 << 30)
    return per_url[url]


def _class(path: str, key: str) -> Any:
    return import_object(path, key=key, user=_USER)
