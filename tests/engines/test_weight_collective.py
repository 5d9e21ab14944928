"""The trainer's side of SGLang's weight-update group (``engine.kwargs.transport: collective``).

Here the server's side is a second process that forms its group the way SGLang 0.5.23's ``init_custom_process_group``
does (a ``tcp://`` rendezvous, the store prefixed by the group's name, torch's own group helper) and receives as its
``receive_weights_from_distributed`` does: this pins that rank 0's hand-built store chain meets torch's, in this
torch. The real server: ``test_sglang_collective_push_gives_the_policys_tokens`` in test_disk_transport.py's company,
``tests/engines/test_collective_transport.py`` (SGLang stage).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import torch

from lit_agentrl.engines.weight_collective import WeightGroup
from lit_agentrl.errors import UserInputError

SERVER_SIDE = textwrap.dedent(
    """
    import json, sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    body, announced = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % int(sys.argv[3]), rank=0, world_size=1)
    timeout = timedelta(seconds=60)
    url = "tcp://%s:%d" % (body["master_address"], body["master_port"])
    store, rank, world = next(rendezvous(url, body["rank_offset"], body["world_size"], timeout=timeout))
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(
        world, rank, [], Backend(body["backend"]), PrefixStore(body["group_name"], store),
        group_name=body["group_name"], timeout=timeout,
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world)}
    received = {}
    for name, dtype, shape in zip(announced["names"], announced["dtypes"], announced["shapes"]):
        tensor = torch.empty(shape, dtype=getattr(torch, dtype))
        dist.broadcast(tensor, src=0, group=group)
        received[name] = tensor.double().flatten().tolist()
    print(json.dumps(received))
    """
)


class EmulatedServer:
    """Answers the group's requests: the join starts the server-side process, the bucket's announcement is passed
    to it, and the answers are SGLang's success dicts (or ``refuse``'s message)."""

    def __init__(self, announced: dict[str, Any], refuse: str | None = None, refuse_join: str | None = None) -> None:
        self.announced, self.refuse, self.refuse_join = announced, refuse, refuse_join
        self.process: subprocess.Popen[str] | None = None
        self.calls: list[str] = []

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(path)
        if path == "/init_weights_update_group" and self.refuse_join:
            return {"success": False, "message": self.refuse_join}
        if path == "/init_weights_update_group":
            from lit_agentrl.engines.weight_collective import free_port

            command = [sys.executable, "-c", SERVER_SIDE, json.dumps(body), json.dumps(self.announced)]
            self.process = subprocess.Popen([*command, str(free_port("127.0.0.1"))], stdout=subprocess.PIPE, text=True)
            return {"success": True, "message": "joined"}
        if path == "/update_weights_from_distributed" and self.refuse:
            return {"success": False, "message": self.refuse}
        return {"success": True, "message": "ok"}


def bucket() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [("a.weight", torch.randn(3, 4)), ("b.bias", torch.randn(5).to(torch.bfloat16))]


def announcement(pairs: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    return {
        "names": [n for n, _ in pairs],
        "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in pairs],
        "shapes": [list(t.shape) for _, t in pairs],
    }


def test_rank_zero_meets_a_group_built_as_sglang_builds_it_and_broadcasts_each_tensor():
    pairs = bucket()
    server = EmulatedServer(announcement(pairs))
    group = WeightGroup(server.post, "http://127.0.0.1:30000", backend="gloo", timeout_s=60)
    try:
        answer = group.send(pairs, flush_cache=False)
        assert answer == {"success": True, "message": "ok"}
        out, _ = server.process.communicate(timeout=60)
    finally:
        group.close()
    received = json.loads(out)
    for name, tensor in pairs:  # bf16 travels as bf16: the bytes the engine holds
        assert received[name] == tensor.double().flatten().tolist()
    assert server.calls == [
        "/init_weights_update_group",
        "/update_weights_from_distributed",
        "/destroy_weights_update_group",
    ]


def test_a_refused_bucket_fails_the_push_with_the_servers_message_instead_of_waiting():
    pairs = bucket()
    server = EmulatedServer({"names": [], "dtypes": [], "shapes": []}, refuse="no weight-update session is open")
    group = WeightGroup(server.post, "http://127.0.0.1:30000", backend="gloo", timeout_s=60)
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"did not take the weights: .*no weight-update session is open"):
            group.send(pairs, flush_cache=False)
    finally:
        group.close()
        server.process.wait(timeout=60)
    assert time.monotonic() - start < 30


def test_a_refused_join_fails_with_the_servers_message_instead_of_waiting_for_its_ranks():
    refusal = "The specified group name has already been created"
    server = EmulatedServer(announcement(bucket()), refuse_join=refusal)
    group = WeightGroup(server.post, "http://127.0.0.1:30000", backend="gloo", timeout_s=5)
    with pytest.raises(RuntimeError, match=f"did not form: the server answered .*{refusal}"):
        group.send(bucket(), flush_cache=False)
    assert server.calls == ["/init_weights_update_group"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for trainers without a GPU")
def test_nccl_without_a_gpu_is_refused_naming_gloo():
    with pytest.raises(UserInputError, match="collective_backend: gloo"):
        WeightGroup(lambda path, body: {}, "http://127.0.0.1:30000", backend="nccl")
