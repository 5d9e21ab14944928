"""HFExportCallback with a LoRA policy: the merged model in the dtype its config.json states, written at the end
(every export only when asked), beside an adapter folder whose base path is absolute."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_lora import lora_module
from transformers import AutoModelForCausalLM

from lit_agentrl.bridge.lora import merged_named_parameters
from lit_agentrl.callbacks.export import HFExportCallback
from lit_agentrl.config.training import Lora
from lit_agentrl.errors import UserInputError
from lit_agentrl.training.module import GRPOModule

LORA_BF16 = Lora(rank=4, alpha=16, target_modules=("q_proj", "v_proj", "down_proj"))  # base_dtype: bfloat16


def trainer_at(step: int) -> SimpleNamespace:
    return SimpleNamespace(is_global_zero=True, global_step=step, strategy=SimpleNamespace(barrier=lambda name: None))


@pytest.fixture
def relative_bf16_policy(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> GRPOModule:
    """The LoRA policy on a bf16 base, its model_path given relative to the working directory."""
    monkeypatch.chdir(tiny_model_dir.parent)
    return lora_module(tiny_model_dir.name, lora=LORA_BF16)


def test_the_merged_model_is_written_in_the_dtype_its_config_states(relative_bf16_policy, tiny_model_dir, tmp_path):
    module = relative_bf16_policy
    HFExportCallback(str(tmp_path)).export(trainer_at(5), module, tmp_path / "final", merge=True)
    merged = tmp_path / "final" / "merged"
    assert json.loads((merged / "config.json").read_text())["dtype"] == "bfloat16"
    tensors = load_file(merged / "model.safetensors")
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    expected = dict(merged_named_parameters(module.policy, torch.bfloat16))
    assert all(torch.equal(tensors[name], expected[name]) for name in tensors)
    loaded = AutoModelForCausalLM.from_pretrained(merged, dtype="auto")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    adapter = json.loads((tmp_path / "final" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tiny_model_dir.resolve())


def test_the_merged_model_is_written_at_the_end_unless_every_export_is_asked(relative_bf16_policy, tmp_path):
    module = relative_bf16_policy
    at_end = HFExportCallback(str(tmp_path / "end"), every_n_steps=1, merge_lora=True)
    at_end.on_train_batch_end(trainer_at(1), module, None, None, 0)
    assert (tmp_path / "end" / "step-1" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "end" / "step-1" / "merged").exists()
    at_end.on_train_end(trainer_at(1), module)
    assert (tmp_path / "end" / "final" / "merged" / "model.safetensors").is_file()
    every = HFExportCallback(str(tmp_path / "every"), every_n_steps=1, merge_lora=True, merge_lora_every_export=True)
    every.on_train_batch_end(trainer_at(1), module, None, None, 0)
    assert (tmp_path / "every" / "step-1" / "merged" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"merge_lora": True, "at_end": False, "every_n_steps": 5}, r"merge_lora .* at_end is false: it would never"),
        ({"merge_lora_every_export": True}, r"merge_lora_every_export needs merge_lora: true"),
        ({"every_n_steps": 0}, r"HFExportCallback\.every_n_steps must be >= 1"),
    ],
)
def test_export_settings_that_would_write_nothing_are_refused(kwargs, fragment):
    with pytest.raises(UserInputError, match=fragment):
        HFExportCallback(**kwargs)


def test_merge_lora_without_lora_is_refused_at_setup():
    with pytest.raises(UserInputError, match=r"merge_lora: true, but model\.lora is off"):
        HFExportCallback(merge_lora=True).setup(trainer_at(0), GRPOModule("unused"), "fit")
