"""``engine.kwargs.transport: disk``: an SGLang server loads each weight push from safetensors files written under a
shared folder (``/update_weights_from_disk``), as servers on other nodes would; the folders are gone afterwards."""

from __future__ import annotations

import asyncio

import pytest
import torch
from support import require_sglang, running_http_engine
from transformers import AutoModelForCausalLM

from lit_agentrl.engines.weight_files import bucket_folder, checked_weights_dir
from lit_agentrl.errors import UserInputError

PROMPT = [9, 10, 11, 12, 13, 14, 15]
GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}


def greedy(engine) -> list[int]:
    return asyncio.run(engine.async_generate(input_ids=PROMPT, sampling_params=GREEDY))["output_ids"]


def reference(model) -> list[int]:
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, eos_token_id=None)
    return out[0, len(PROMPT) :].tolist()


def test_the_folder_is_refused_unless_set_and_writable(tmp_path):
    with pytest.raises(UserInputError, match=r"transport: disk needs engine\.kwargs\.weights_dir"):
        checked_weights_dir(None)
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(
        UserInputError, match=r"weights_dir .*file/weights' is not a writable folder: .*Not a directory"
    ):
        checked_weights_dir(str(blocked / "weights"))


def test_a_bucket_is_one_safetensors_file_in_a_folder_of_its_own_then_removed(tmp_path):
    from safetensors.torch import load_file

    pairs = [("a.weight", torch.ones(2, 3, dtype=torch.bfloat16)), ("b.bias", torch.arange(4.0))]
    with bucket_folder(tmp_path, pairs) as folder:
        assert [p.name for p in folder.iterdir()] == ["model.safetensors"]
        loaded = load_file(str(folder / "model.safetensors"))
        assert loaded["a.weight"].dtype == torch.bfloat16 and torch.equal(loaded["b.bias"], torch.arange(4.0))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.sglang
def test_a_server_generates_as_the_pushed_weights_through_disk(tiny_model_dir, tmp_path):
    from lit_agentrl.bridge.weights import sync_weights
    from lit_agentrl.engines.sglang import SGLangHTTPEngine

    require_sglang()
    updated = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in updated.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    with running_http_engine(tiny_model_dir) as inline:
        disk = SGLangHTTPEngine(inline.url, str(tiny_model_dir), transport="disk", weights_dir=str(tmp_path / "w"))
        try:
            before = greedy(disk)
            pushed = sync_weights(updated, [disk], bucket_bytes=64 << 10, weight_version=3)  # several buckets
            assert greedy(disk) == reference(updated) != before
            assert pushed.bytes == sum(p.numel() * p.element_size() for p in updated.parameters())
            assert list((tmp_path / "w").iterdir()) == []  # every bucket's folder removed
            ok, message = disk.update_weights_from_tensor([("model.norm.weight", torch.zeros(3))])
            assert not ok and "shape" in message  # checked before writing: SGLang's disk loader would accept it
        finally:
            disk.shutdown()
