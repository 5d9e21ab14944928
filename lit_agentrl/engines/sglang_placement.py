"""Where an in-process SGLang engine, or a group's server, runs: on its rank's GPUs, with a rendezvous port of its
own (:func:`placed_server_args`, :func:`rank_nccl_port`; the plan itself is :mod:`~lit_agentrl.engines.placement`'s).
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from lit_agentrl.engines import sglang_group
from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.engines.sglang_base import on_accelerator

log = logging.getLogger(__name__)


def placed_server_args(engine_kwargs: dict[str, Any], placement: EnginePlacement | None) -> dict[str, Any]:
    """``engine.kwargs`` for an in-process engine of the rank at ``placement``: on its own GPUs.

    On an accelerator (``device`` unset with CUDA available, or any device but ``cpu``/``mps``) the engine gets
    ``base_gpu_id`` = the first GPU of the rank's group (:class:`EnginePlacement`), where SGLang would put every
    rank's engine on GPU 0; a ``base_gpu_id`` in ``engine.kwargs`` is kept (and logged). Without a placement (an
    engine built outside a trainer) ``engine.kwargs`` are returned unchanged.
    """
    kwargs = dict(engine_kwargs)
    if placement is None or not on_accelerator(kwargs.get("device")):
        return kwargs
    plan = placement.with_tp_size(int(kwargs.get("tp_size", 1)))
    if "base_gpu_id" in kwargs:
        log.info(
            "engine 'sglang' on rank %d: engine.kwargs.base_gpu_id=%s is kept (the placement would be GPU %d)",
            plan.global_rank,
            kwargs["base_gpu_id"],
            plan.base_gpu_id,
        )
        return kwargs
    kwargs["base_gpu_id"] = plan.base_gpu_id
    return kwargs


def rank_nccl_port(placement: EnginePlacement, base: int = sglang_group.DEFAULT_GROUP_PORT + 100) -> int:
    """The port where the in-process engine of the rank at ``placement`` rendezvous its scheduler's process group:
    ``base`` + the global rank, or the first free one all ranks further on (``engine.kwargs.nccl_port`` wins). The
    global rank keeps apart the ranks of one node, and also of "nodes" that share one machine (a rehearsal).

    Left unset, SGLang 0.5.23 draws it with Python's global ``random`` (``PortArgs.init_new`` ->
    ``get_free_port_below_ephemeral``), which ``seed_everything`` seeds alike on every rank, and every rank builds
    its engine right after the same barrier: the ranks of a node would draw the same port and all but one fail.
    """
    for port in range(base + placement.global_rank, 65536, placement.world_size):
        if _port_is_free(port):
            return port
    raise RuntimeError(f"no free port from {base + placement.global_rank} up for the engine's rendezvous")


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))  # as SGLang's TCP store binds it
        except OSError:
            return False
    return True


def placed_group_args(engine_kwargs: dict[str, Any], placement: EnginePlacement) -> dict[str, Any]:
    """``engine.kwargs`` for the server a group of ranks shares: placed as :func:`placed_server_args` places an
    in-process engine (on CPU SGLang reads ``base_gpu_id`` as a NUMA node, so it is left unset there)."""
    kwargs = placed_server_args(engine_kwargs, placement)
    kwargs["tp_size"] = placement.tp_size
    return kwargs
