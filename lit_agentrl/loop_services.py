"""Services that run on a rollout's event loop and must stop with it, known to whoever closes the loop.

The OpenAI gateway serves from the rollout's own loop, started on first use by the agents that call it; the rollout
manager, which owns the loop, must stop it before the loop closes, but sits on a floor that does not know the gateway.
So the gateway registers its stopper here on import (:func:`register_loop_service`), and the manager stops whatever is
registered (:func:`stop_loop_services`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["register_loop_service", "stop_loop_services"]

LoopStopper = Callable[[asyncio.AbstractEventLoop], None]
"""Stops a service's instances serving from the given loop, called from outside that loop."""

_stoppers: list[LoopStopper] = []


def register_loop_service(stop: LoopStopper) -> LoopStopper:
    """Have :func:`stop_loop_services` call ``stop`` (once, however often it is registered)."""
    if stop not in _stoppers:
        _stoppers.append(stop)
    return stop


def stop_loop_services(loop: asyncio.AbstractEventLoop) -> None:
    """Stop every registered service serving from ``loop``."""
    for stop in _stoppers:
        stop(loop)
