"""Setting up ``model.lora.sync: adapter`` (no SGLang needed): the trainer starts SGLang to serve the adapters, refuses
at setup what cannot serve them (naming what is missing), and every rank's requests name the adapter its server's
owner loaded. ``test_lora_adapter_serving.py`` runs the adapters on the engines themselves."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from support import SGLANG_CPU
from transformers import AutoModelForCausalLM

from lit_agentrl.callbacks.rollout_wiring import adapter_serving_kwargs
from lit_agentrl.config.rollout import EngineSettings
from lit_agentrl.config.training import Lora
from lit_agentrl.engines.sglang import SGLangEngine, SGLangHTTPEngine
from lit_agentrl.errors import UserInputError
from lit_agentrl.rollout.fleet import EngineFleet
from lit_agentrl.training.lora import add_adapters

LORA = Lora(rank=4, base_dtype="float32", sync="adapter")


def test_the_trainer_starts_sglang_to_serve_the_adapters_under_the_users_own_kwargs():
    kwargs = adapter_serving_kwargs(
        EngineSettings(name="sglang", kwargs={**SGLANG_CPU, "max_loras_per_batch": 2}), LORA
    )
    assert kwargs == {
        **SGLANG_CPU,
        "max_loras_per_batch": 2,
        "enable_lora": True,
        "max_lora_rank": 4,
        "lora_target_modules": list(LORA.target_modules),
        "lora_strict_loading": True,  # else SGLang drops an unmatched tensor with a warning
        "lora_backend": "torch_native",  # on CPU: SGLang's default backend runs Triton kernels
    }
    on_gpu = adapter_serving_kwargs(EngineSettings(name="sglang", kwargs={"device": "cuda", "max_lora_rank": 8}), LORA)
    assert "lora_backend" not in on_gpu and on_gpu["max_lora_rank"] == 8  # the user's own win
    users_servers = {"urls": ["http://127.0.0.1:1"]}
    assert adapter_serving_kwargs(EngineSettings(name="sglang_http", kwargs=users_servers), LORA) == users_servers


def test_adapter_sync_is_refused_where_the_engine_drops_its_base_in_colocated_windows():
    with pytest.raises(UserInputError, match="engine 'sglang' frees its base weights in every colocated window"):
        adapter_serving_kwargs(EngineSettings(name="sglang", colocate=True), LORA)
    adapter_serving_kwargs(EngineSettings(name="transformers", colocate=True), LORA)  # it keeps them


class StandInSGLang(SGLangEngine):
    """The in-process SGLang engine over a stand-in answering ``get_server_info`` with ``info``."""

    def __init__(self, model_path: str, info: dict[str, Any], **kwargs: Any) -> None:
        self.info = info
        super().__init__(model_path, **kwargs)

    def _launch(self, **server_args: Any) -> Any:
        return SimpleNamespace(loop=None, get_server_info=lambda: dict(self.info), shutdown=lambda: None)


@pytest.mark.parametrize(
    ("info", "dtype", "problem"),
    [
        (
            {"enable_lora": False},
            "float32",
            "was started without LoRA: start it with --enable-lora --lora-strict-loading --max-lora-rank 4 "
            "--lora-target-modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj",
        ),
        ({"enable_lora": True, "max_lora_rank": 2}, "float32", "up to rank 2 (--max-lora-rank), below 4"),
        (
            {"enable_lora": True, "max_lora_rank": 8, "lora_target_modules": ["q_proj", "v_proj"]},
            "float32",
            "serves no adapters on ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'up_proj']",
        ),
        ({"enable_lora": True, "max_lora_rank": 8, "lora_target_modules": ["all"], "dp_size": 2}, "float32", "2 data"),
        (
            {"enable_lora": True, "max_lora_rank": 8, "lora_target_modules": ["all"]},
            "bfloat16",
            "holds the base in torch.bfloat16 and the trainer in torch.float32",
        ),
    ],
)
def test_an_engine_that_cannot_serve_the_adapters_is_refused_at_setup_naming_what_it_lacks(
    tiny_model_dir, info, dtype, problem
):
    engine = StandInSGLang(str(tiny_model_dir), info, dtype=dtype)
    with pytest.raises(UserInputError, match=r"model\.lora\.sync: adapter") as refused:
        EngineFleet([engine], lora=LORA)
    assert problem in str(refused.value)
    serving = {"enable_lora": True, "max_lora_rank": 4, "lora_target_modules": ["all"]}
    EngineFleet([StandInSGLang(str(tiny_model_dir), serving, dtype="float32")], lora=LORA)
    EngineFleet([engine], lora=dataclasses.replace(LORA, sync="merged"))  # merged weights: any engine


def test_a_rank_sharing_a_server_names_the_adapter_its_owner_loaded(tiny_model_dir):
    engine = SGLangHTTPEngine("http://127.0.0.1:1", str(tiny_model_dir), owner=False)  # another rank pushes
    fleet = EngineFleet([engine], lora=LORA)  # its owner checks the server
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    add_adapters(policy, LORA)
    sent: list[dict[str, Any]] = []

    class Recording:
        async def get(self, path: str, **kwargs: Any) -> Any:  # the server's context length and settings: none known
            return SimpleNamespace(raise_for_status=lambda: None, json=dict)

        async def post(self, path: str, json: dict[str, Any], **kwargs: Any) -> Any:
            sent.append(json)
            return SimpleNamespace(raise_for_status=lambda: None, json=lambda: {"output_ids": [], "meta_info": {}})

    engine._client = Recording  # type: ignore[method-assign]
    for version in (1, 2):
        fleet.push(policy, version)  # the owner loads, every rank passes the barrier, this one follows
        asyncio.run(engine.async_generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 1}))
    assert [body["lora_path"] for body in sent] == ["lit-agentrl-policy-1", "lit-agentrl-policy-2"]
