"""An OpenAI-compatible API over the rollout engines, so agents written against an OpenAI client train unchanged.

* :mod:`.server`: :class:`Gateway`, ``/v1/chat/completions`` and ``/v1/models`` on loopback, one per engine and
  rollout loop, started on first use;
* :mod:`.session`: one trajectory's calls, kept token-exact (:class:`GatewaySession`);
* :func:`gateway_for`, :func:`close_gateways`: the gateways of this process, by engine and event loop.

Agents use it through :func:`lit_agentrl.agents.openai_client.register_openai_agent`.
"""

from __future__ import annotations

import asyncio
import contextlib

from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.agents.gateway.server import Gateway, GatewayError
from lit_agentrl.agents.gateway.session import GatewaySample, GatewaySession
from lit_agentrl.loop_services import register_loop_service

__all__ = ["Gateway", "GatewayError", "GatewaySample", "GatewaySession", "close_gateways", "gateway_for"]

_gateways: dict[tuple[int, int], tuple[asyncio.AbstractEventLoop, Gateway]] = {}
_starting: dict[tuple[int, int], asyncio.Lock] = {}


async def gateway_for(chat_model: ChatModel) -> Gateway:
    """The running loop's gateway for ``chat_model``'s engine (started on first use)."""
    loop = asyncio.get_running_loop()
    key = (id(chat_model.llm), id(loop))
    lock = _starting.setdefault(key, asyncio.Lock())
    async with lock:
        if key not in _gateways:
            gateway = Gateway(chat_model)
            await gateway.start()
            _gateways[key] = (loop, gateway)
    return _gateways[key][1]


@register_loop_service  # the rollout manager stops them with its loop
def close_gateways(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Stop the gateways serving from ``loop`` (every loop's when None), from outside that loop."""
    for key, (owner, gateway) in list(_gateways.items()):
        if loop is not None and owner is not loop:
            continue
        del _gateways[key]
        _starting.pop(key, None)
        if owner.is_closed():
            continue
        with contextlib.suppress(Exception):
            if owner.is_running():
                asyncio.run_coroutine_threadsafe(gateway.stop(), owner).result(timeout=15)
            else:
                owner.run_until_complete(gateway.stop())
