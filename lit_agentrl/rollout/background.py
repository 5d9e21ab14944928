"""An event loop on a thread of its own, where rollouts run while the trainer trains (``RolloutCallback.async_rollouts``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.errors import UserInputError

T = TypeVar("T")


class BackgroundLoop:
    """A daemon thread running one asyncio loop; :meth:`submit` schedules a coroutine there from any thread.

    The engines must be able to serve a loop other than the trainer's (``RolloutEngine.generates_beside_trainer``):
    an in-process SGLang engine serves requests only from its own loop, on the trainer's thread.
    """

    def __init__(self, engines: Sequence[RolloutEngine]) -> None:
        unable = sorted({type(e).__name__ for e in engines if not e.generates_beside_trainer})
        if unable:
            raise UserInputError(
                f"RolloutCallback.async_rollouts needs engines that generate beside the trainer; {unable} cannot",
                hint="use the transformers engine, or mode: sync",
            )
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="lit-agentrl-rollouts", daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def stop(self) -> None:
        """Cancel whatever still runs there, then stop and close the loop."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_default_executor()

        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=60)
        self.loop.close()
