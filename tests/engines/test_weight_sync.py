"""What the weight push sends: tensors in the engines' dtype, in buckets that never pass the cap."""

from __future__ import annotations

import torch

from lit_agentrl.bridge.weights import buckets, sync_weights
from lit_agentrl.engines.base import RolloutEngine


class RecordingEngine(RolloutEngine):
    """Keeps each bucket it is sent (names, dtypes and bytes); generates nothing."""

    def __init__(self, weight_dtype: torch.dtype | None) -> None:
        self.weight_dtype = weight_dtype
        self.pushed: list[list[tuple[str, torch.Tensor]]] = []

    async def async_generate(self, *args, **kwargs):  # pragma: no cover - never asked here
        raise NotImplementedError

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.pushed.append(list(named_tensors))
        return True, "ok"


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))


def test_a_bf16_engine_gets_bf16_tensors_rounded_as_its_own_load_would():
    engine = RecordingEngine(torch.bfloat16)
    policy = model()
    sync_weights(policy, [engine])
    sent = dict(pair for bucket in engine.pushed for pair in bucket)
    assert {t.dtype for t in sent.values()} == {torch.bfloat16}  # half the bytes of the fp32 master weights
    for name, param in policy.named_parameters():
        assert torch.equal(sent[name], param.detach().to(torch.bfloat16))


def test_an_engine_that_does_not_say_its_dtype_gets_the_trainers_and_mixed_engines_too():
    policy = model()
    for engines in ([RecordingEngine(None)], [RecordingEngine(torch.bfloat16), RecordingEngine(torch.float32)]):
        sync_weights(policy, engines)
        assert all(t.dtype == torch.float32 for engine in engines for bucket in engine.pushed for _, t in bucket)


def test_a_bucket_never_passes_its_cap_and_a_larger_tensor_goes_alone():
    sizes = [100, 300, 700, 2000, 50, 60]  # bytes, as uint8 tensors
    named = ((f"t{i}", torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate(sizes))
    grouped = [[name for name, _ in bucket] for bucket in buckets(named, bucket_bytes=1000)]
    assert grouped == [["t0", "t1"], ["t2"], ["t3"], ["t4", "t5"]]  # t2 would make 1100; t3 alone is over the cap
