"""LoRA's weight sync: after an update, the transformers engine reproduces the policy's greedy tokens (and its
log-probs), whether it gets the merged weights or the adapter alone; an engine that cannot serve adapters is
refused at setup; and ``lit-agentrl fit --model.lora.rank 8`` trains the quickstart both ways."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml
from support import REPO_ROOT, short_fit
from test_lora import LORA, lora_module

from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.engines.weight_sync import sync_weights
from lit_agentrl.errors import UserInputError
from lit_agentrl.rollout.fleet import EngineFleet

PROMPT = [5, 9, 11, 3, 7, 21]


def policy_greedy(model: torch.nn.Module, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    tokens, logprobs = list(ids), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([tokens])).logits[0, -1].float()
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            tokens.append(token)
    return tokens[len(ids) :], logprobs


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_the_synced_engine_reproduces_the_policys_greedy_tokens(tiny_model_dir, sync):
    lora = dataclasses.replace(LORA, sync=sync)
    module = lora_module(str(tiny_model_dir), lora=lora)  # B is not zero: as after updates
    engine = TransformersEngine(str(tiny_model_dir), prefix_cache_mb=0)
    try:
        params = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
        before = engine.generate(input_ids=PROMPT, sampling_params=params)["output_ids"]
        pushed = sync_weights(module.policy, [engine], lora=lora)
        result = engine.generate(input_ids=PROMPT, sampling_params=params, return_logprob=True)
    finally:
        engine.shutdown()
    tokens, logprobs = policy_greedy(module.policy, PROMPT, 12)
    assert result["output_ids"] == tokens and before != tokens
    engine_logprobs = [entry[0] for entry in result["meta_info"]["output_token_logprobs"]]
    assert engine_logprobs == pytest.approx(logprobs, abs=1e-4)
    layers = module.policy.config.num_hidden_layers
    adapter_tensors = 2 * layers * len(lora.target_modules)
    assert pushed == (adapter_tensors if sync == "adapter" else len(dict(engine.model.named_parameters())))


class PlainEngine(RolloutEngine):
    async def async_generate(self, *args, **kwargs):
        raise AssertionError("not called")

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        return True, ""


def test_an_engine_that_cannot_serve_adapters_is_refused_for_adapter_sync():
    with pytest.raises(UserInputError, match=r"model.lora.sync: adapter needs engines .*\['PlainEngine'\]"):
        EngineFleet([PlainEngine()], lora=dataclasses.replace(LORA, sync="adapter"))
    EngineFleet([PlainEngine()], lora=LORA)  # merged weights: any engine


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_the_quickstart_trains_with_lora(tmp_path, quickstart_model_dir, monkeypatch, sync):
    monkeypatch.chdir(REPO_ROOT)
    settings = yaml.safe_load((REPO_ROOT / "configs/quickstart.yaml").read_text())
    settings["model"]["lora"] = {"rank": 8, "sync": sync}
    config = tmp_path / "quickstart_lora.yaml"
    config.write_text(yaml.safe_dump(settings))
    rows = [r for r in short_fit(config, quickstart_model_dir, tmp_path / "log") if r.get("train/loss")]
    assert len(rows) == 3
    assert all(float(r["rollout/failed"]) == 0.0 and float(r["train/grad_norm"]) > 0 for r in rows)
