"""Colocated mode: the trainer's cached accelerator memory is handed back before SGLang resumes its weights and
its KV cache (otherwise SGLang would find the trainer's training peak still reserved), and never on CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lit_agentrl.callbacks import RolloutCallback
from lit_agentrl.engines import RolloutEngine
from lit_agentrl.module import GRPOModule


class ResumeRecorder(RolloutEngine):
    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def async_generate(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def update_weights_from_tensor(self, named_tensors: Any, load_format: Any = None, flush_cache: bool = True):
        return True, ""

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.events.append(f"resume {','.join(tags or [])}")


@pytest.mark.parametrize("device, emptied", [(torch.device("cuda", 0), True), (torch.device("cpu"), False)])
def test_cache_is_emptied_before_each_resume(device, emptied, monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    callback = RolloutCallback(colocate=True)
    callback.engines = [ResumeRecorder(events)]
    callback._released = True  # as after a rollout in colocated mode
    module = GRPOModule("unused")
    module._device = device  # where the strategy put the module; nothing is allocated there
    callback._prepare_engines(trainer=None, pl_module=module)  # type: ignore[arg-type]  # no sync is pending
    expected = ["empty_cache", "resume weights", "empty_cache", "resume kv_cache"]
    assert events == (expected if emptied else [e for e in expected if e != "empty_cache"])
