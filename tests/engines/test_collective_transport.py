"""``engine.kwargs.transport: collective``: a real SGLang server joins the trainer's weight-update group and receives
each push over it (``update_weights_from_distributed``), gloo on CPU as NCCL on GPUs; then generates as the pushed
weights, bit for bit in float32."""

from __future__ import annotations

import pytest
import torch
from support import require_sglang, running_http_engine
from test_disk_transport import greedy, reference
from transformers import AutoModelForCausalLM


def perturbed(model_dir, seed: int) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return model


@pytest.mark.sglang
def test_a_server_generates_as_the_weights_pushed_over_a_gloo_group(tiny_model_dir):
    from lit_agentrl.bridge.weights import sync_weights
    from lit_agentrl.engines.sglang import SGLangHTTPEngine

    require_sglang()
    with running_http_engine(tiny_model_dir) as inline:
        engine = SGLangHTTPEngine(inline.url, str(tiny_model_dir), transport="collective", collective_backend="gloo")
        try:
            before = greedy(engine)
            for seed in (1, 2):  # the group formed at the first push serves the next
                updated = perturbed(tiny_model_dir, seed)
                pushed = sync_weights(updated, [engine], bucket_bytes=64 << 10, weight_version=seed)
                assert greedy(engine) == reference(updated) != before
                assert pushed.bytes == sum(p.numel() * p.element_size() for p in updated.parameters())
            ok, message = engine.update_weights_from_tensor([("model.norm.weight", torch.zeros(3))])
            assert not ok and "shape" in message  # checked before announcing: a wrong shape would kill the scheduler
            group = engine.weight_group.name
        finally:
            engine.shutdown()  # leaves the group, and the server destroys its side
        gone = inline._post("/destroy_weights_update_group", {"group_name": group})
        assert gone["success"] is False and "does not exist" in gone["message"]


@pytest.mark.sglang
def test_pushes_travel_in_the_servers_dtype(tiny_model_dir):
    """A bf16 server (``--dtype bfloat16``) gets the fp32 policy's weights as bf16: half the bytes."""
    from lit_agentrl.bridge.weights import sync_weights
    from lit_agentrl.engines.sglang import SGLangHTTPEngine

    require_sglang()
    with running_http_engine(tiny_model_dir, extra_args=["--dtype", "bfloat16"]) as inline:
        engine = SGLangHTTPEngine(inline.url, str(tiny_model_dir), transport="collective", collective_backend="gloo")
        try:
            assert engine.weight_dtype == torch.bfloat16
            updated = perturbed(tiny_model_dir, 1)
            pushed = sync_weights(updated, [engine], weight_version=1)
            assert pushed.bytes == sum(p.numel() * 2 for p in updated.parameters())
            assert len(greedy(engine)) == 8
        finally:
            engine.shutdown()
