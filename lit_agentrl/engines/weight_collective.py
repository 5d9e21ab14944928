"""Weights over a collective: the trainer's side of SGLang's weight-update group (``init_weights_update_group`` +
``update_weights_from_distributed``), NCCL between GPUs, gloo between CPUs (the CPU rehearsal).

The trainer is rank 0 of a small process group of its own with one server's tensor-parallel ranks (1..tp); it never
touches the trainer's default group (FSDP's). SGLang 0.5.23 builds its side with ``init_custom_process_group``: a
``tcp://`` rendezvous at the trainer's store, then the store prefixed by the group's name, then by ``<name>/``, then by
the device (``cpu/`` for gloo, ``cuda/`` for NCCL), as torch's own group helper does. Rank 0 builds the same chain by
hand, so the two sides meet (pinned by ``tests/engines/test_weight_collective.py``).

Each bucket is one ``update_weights_from_distributed`` request, sent from a thread while rank 0 broadcasts the
bucket's tensors in the request's order; the server receives each into a tensor of the announced dtype and shape. A
request the server refuses (answered before the broadcasts are taken) fails the push with its message instead of
leaving rank 0 waiting in a broadcast nobody joins; every wait is bounded by ``timeout_s``.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from lit_agentrl.errors import UserInputError

log = logging.getLogger(__name__)

BACKENDS = {"gloo": "cpu", "nccl": "cuda"}
"""Backend -> the device its tensors live on (and the store prefix torch gives that device's group)."""

Post = Callable[[str, dict[str, Any]], Any]
"""POST a JSON body to one of the server's paths; SGLang's answer as a dict."""


def reachable_address(server_url: str) -> str:
    """This machine's address on the route to ``server_url``'s host (a UDP connect sends nothing): what the server
    can reach the trainer's store at."""
    host = urlparse(server_url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return str(probe.getsockname()[0])


def free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


class WeightGroup:
    """Rank 0 of one SGLang server's weight-update group: joined at :meth:`join`, fed by :meth:`send`, left at
    :meth:`close`.

    Args:
        post: sends a request to the server (its path and JSON body).
        backend: ``nccl`` (GPUs) or ``gloo`` (CPUs).
        tp_size: the server's tensor-parallel ranks, each a member of the group.
        address: where the server reaches this rank's store (None: this machine's address on the route to it).
        port: the store's port (None: a free one).
        timeout_s: the longest any wait of the group may take (rendezvous, a broadcast, the server's answer).
    """

    def __init__(
        self,
        post: Post,
        server_url: str,
        backend: str = "nccl",
        tp_size: int = 1,
        address: str | None = None,
        port: int | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        if backend not in BACKENDS:
            raise UserInputError(f"engine.kwargs.collective_backend must be one of {list(BACKENDS)}, got {backend!r}")
        if backend == "nccl" and not torch.cuda.is_available():
            raise UserInputError(
                "engine.kwargs.collective_backend: nccl needs a GPU on the trainer; on CPU use collective_backend: gloo"
            )
        self._post, self.backend, self.world_size = post, backend, tp_size + 1
        self.address = address or reachable_address(server_url)
        self.port = port or free_port(self.address)
        self.timeout = timedelta(seconds=timeout_s)
        self.name = f"lit-agentrl-weights-{uuid.uuid4().hex[:12]}"  # fresh: SGLang keeps a name until destroyed
        self._group: Any = None
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="weight-group")  # a request, and the group forming

    @property
    def device(self) -> str:
        return BACKENDS[self.backend]

    def join(self) -> None:
        """Ask the server to join, and join as rank 0; both sides block until all ranks have met."""
        body = {
            "master_address": self.address,
            "master_port": self.port,
            "rank_offset": 1,
            "world_size": self.world_size,
            "group_name": self.name,
            "backend": self.backend,
        }
        answer = self._pool.submit(self._post, "/init_weights_update_group", body)
        store = dist.TCPStore(
            self.address, self.port, self.world_size, is_master=True, timeout=self.timeout, wait_for_workers=False
        )
        chain = dist.PrefixStore(
            f"{self.device}/", dist.PrefixStore(f"{self.name}/", dist.PrefixStore(self.name, store))
        )
        forming = self._pool.submit(self._process_group, chain)  # blocks until the server's ranks arrive
        self._until(forming.done, answer, "the weight-update group did not form")
        self._group = forming.result()
        self._check(answer, "init_weights_update_group")

    def _process_group(self, store: Any) -> Any:
        if self.backend == "gloo":
            return dist.ProcessGroupGloo(store, 0, self.world_size, self.timeout)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = self.timeout
        return dist.ProcessGroupNCCL(store, 0, self.world_size, options)

    def send(self, pairs: list[tuple[str, torch.Tensor]], flush_cache: bool) -> Any:
        """One bucket: the server's request announcing it, and each tensor broadcast in its order. SGLang's answer."""
        if self._group is None:
            self.join()
        tensors = [tensor.detach().to(self.device).contiguous() for _, tensor in pairs]
        body = {
            "names": [name for name, _ in pairs],
            "dtypes": [str(tensor.dtype).removeprefix("torch.") for tensor in tensors],
            "shapes": [list(tensor.shape) for tensor in tensors],
            "group_name": self.name,
            "flush_cache": flush_cache,
        }
        answer = self._pool.submit(self._post, "/update_weights_from_distributed", body)
        options = dist.BroadcastOptions()
        options.rootRank = 0
        works = [self._group.broadcast([tensor], options) for tensor in tensors]
        self._wait(works, answer)
        return answer.result()

    def _wait(self, works: list[Any], answer: Future) -> None:
        self._until(lambda: all(work.is_completed() for work in works), answer, "the server did not take the weights")
        for work in works:
            work.wait()

    def _until(self, done: Callable[[], bool], answer: Future, failure: str) -> None:
        """Wait until ``done()``; a refusal the server answers first, or ``timeout_s``, ends the wait with an error
        (and leaves this group spent: its other side is not listening)."""
        deadline = time.monotonic() + self.timeout.total_seconds()
        while not done():
            if answer.done() and not self._succeeded(answer):
                self._group = None
                raise RuntimeError(f"{failure}: {self._answer(answer)}")
            if time.monotonic() > deadline:
                self._group = None
                raise RuntimeError(f"{failure} within {self.timeout}: {self._answer(answer)}")
            time.sleep(0.005)

    def close(self) -> None:
        """Leave the group, and ask the server to destroy its side (else the name stays taken there)."""
        if self._group is not None:
            self._group = None
            try:
                self._post("/destroy_weights_update_group", {"group_name": self.name})
            except Exception as exc:  # a server that is gone has no group left to destroy
                log.warning("could not ask the server to destroy the weight-update group %s: %r", self.name, exc)
        self._pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _succeeded(answer: Future) -> bool:
        return answer.exception() is None and bool((answer.result() or {}).get("success", True))

    @staticmethod
    def _answer(answer: Future) -> str:
        if not answer.done():
            return "the server has not answered"
        if answer.exception() is not None:
            return f"the request failed: {answer.exception()!r}"
        return f"the server answered {answer.result()}"

    def _check(self, answer: Future, what: str) -> None:
        try:
            answer.result(timeout=self.timeout.total_seconds())
        except Exception as exc:
            raise RuntimeError(f"SGLang {what} failed: {exc!r}") from exc
        if not self._succeeded(answer):
            raise RuntimeError(f"SGLang {what} failed: {self._answer(answer)}")
