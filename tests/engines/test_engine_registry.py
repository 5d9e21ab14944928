"""Engines are chosen by registered name: the built-ins, and a user's own class named in the config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lit_agentrl.callbacks import RolloutCallback
from lit_agentrl.config.rollout import EngineSettings
from lit_agentrl.engines import (
    EngineWrapper,
    RolloutEngine,
    build_engines,
    get_engine_class,
    register_engine,
    registered_engines,
)
from lit_agentrl.engines.base import check_named_tensors
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.training.module import GRPOModule

BUILT: list[RecordingEngine] = []


@register_engine("recording_engine_for_tests")
class RecordingEngine(EngineWrapper):
    """A user's engine, as a config names it: the transformers engine, counting what it serves."""

    def __init__(self, model_path: str, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(TransformersEngine(model_path, seed=seed, **kwargs))
        self.kwargs, self.requests, self.updates = kwargs, 0, 0
        BUILT.append(self)

    async def async_generate(self, **kwargs: Any) -> Any:
        self.requests += 1
        return await self.inner.async_generate(**kwargs)

    def update_weights_from_tensor(self, named_tensors: Any, load_format: str | None = None, flush_cache: bool = True):
        self.updates += 1
        return self.inner.update_weights_from_tensor(named_tensors, load_format, flush_cache)


class MinimalEngine(RolloutEngine):
    async def async_generate(self, input_ids=None, sampling_params=None, return_logprob=False, **kwargs):
        return {"output_ids": [], "meta_info": {}}

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        return True, ""


def test_builtin_names_are_registered_and_resolve_to_their_classes():
    from lit_agentrl.engines.sglang import SGLangEngine, SGLangHTTPEngine

    assert {"transformers", "sglang", "sglang_http", "recording_engine_for_tests"} <= set(registered_engines())
    assert get_engine_class("transformers") is TransformersEngine
    assert get_engine_class("sglang") is SGLangEngine and get_engine_class("sglang_http") is SGLangHTTPEngine


def test_unknown_engine_lists_the_names_and_says_how_to_register():
    with pytest.raises(ValueError, match="unknown rollout engine 'nope'") as excinfo:
        build_engines("nope", "unused")
    message = str(excinfo.value)
    assert "'sglang_http'" in message and "'transformers'" in message and "'recording_engine_for_tests'" in message
    assert "@register_engine('nope')" in message and "engine.modules" in message


def test_only_complete_rollout_engine_subclasses_register():
    with pytest.raises(TypeError, match=r"subclass of lit_agentrl\.engines\.RolloutEngine"):
        register_engine("not_an_engine")(dict)

    class Half(RolloutEngine):
        async def async_generate(self, input_ids=None, sampling_params=None, return_logprob=False, **kwargs): ...

    with pytest.raises(TypeError, match="update_weights_from_tensor"):
        register_engine("half_engine")(Half)
    with pytest.raises(TypeError):
        Half()  # the contract is checked on instantiation too
    assert "half_engine" not in registered_engines()


def test_base_class_defaults_are_those_of_an_engine_without_the_feature():
    engine = MinimalEngine()
    assert (engine.shared, engine.loop, engine.busy_seconds) == (False, None, None)
    assert engine.flush_cache() is True
    engine.begin_weight_update(), engine.end_weight_update(), engine.reseed(3)
    engine.release_memory_occupation(["weights"]), engine.resume_memory_occupation(["weights"]), engine.shutdown()


def test_wrapper_forwards_the_wrapped_engines_members(tiny_model_dir):
    inner = TransformersEngine(str(tiny_model_dir))
    try:
        wrapper = EngineWrapper(inner)
        inner.scheduler.busy_seconds = 1.5
        assert (wrapper.shared, wrapper.loop, wrapper.busy_seconds) == (False, None, 1.5)
        wrapper.reseed(4)
        assert inner.seed == 4
        ok, message = wrapper.update_weights_from_tensor([("model.norm.weight", torch.zeros(3))])
        assert not ok and "shape" in message
    finally:
        EngineWrapper(inner).shutdown()


def test_weight_check_is_shared_and_names_the_bad_weight():
    shapes = {"a.weight": (2, 3)}
    assert check_named_tensors([("a.weight", torch.zeros(2, 3))], shapes) is None
    assert (
        check_named_tensors([("b", torch.zeros(1))], shapes)
        == "unknown weight 'b'; the engine's model has e.g. ['a.weight']"
    )
    assert check_named_tensors([("a.weight", torch.zeros(3))], shapes) == "weight 'a.weight': shape (3,) != (2, 3)"


def test_sglang_http_builds_one_client_per_url_and_needs_urls(tiny_model_dir):
    with pytest.raises(ValueError, match=r"engine 'sglang_http' needs engine\.kwargs\.urls"):
        build_engines("sglang_http", str(tiny_model_dir))
    engines = build_engines("sglang_http", str(tiny_model_dir), urls=["http://a:1/", "http://b:2"], timeout_s=5)
    assert [e.url for e in engines] == ["http://a:1", "http://b:2"] and all(e.shared for e in engines)
    for engine in engines:
        engine.shutdown()


def test_importing_the_engines_or_naming_sglang_does_not_import_sglang():
    code = (
        "import sys, lit_agentrl.engines as e\n"
        "assert 'lit_agentrl.engines.hf' not in sys.modules\n"
        "e.get_engine_class('sglang'), e.get_engine_class('sglang_http')\n"
        "assert 'sglang' not in sys.modules, 'sglang imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def fake_run(model_dir: Path) -> tuple[Any, Any]:
    trainer = SimpleNamespace(
        global_rank=0, local_rank=0, num_devices=1, world_size=1, datamodule=SimpleNamespace(reward_fn=None)
    )
    pl_module = GRPOModule(str(model_dir))  # setup reads its settings only; the model is not loaded
    return trainer, pl_module


def test_callback_imports_engine_modules_and_builds_the_named_engine(quickstart_model_dir):
    callback = RolloutCallback(
        engine=EngineSettings("recording_engine_for_tests", {"max_running_requests": 4}, [__name__])
    )
    trainer, pl_module = fake_run(quickstart_model_dir)
    callback.setup(trainer, pl_module, "fit")
    try:
        assert callback.step is not None
        (engine,) = callback.step.fleet.engines
        assert isinstance(engine, RecordingEngine) and engine.kwargs == {"max_running_requests": 4}
        assert callback.step.loop.manager.engines == [engine]
    finally:
        callback.teardown(trainer, pl_module, "fit")


def test_callback_names_an_engine_module_that_cannot_be_imported(quickstart_model_dir, tmp_path):
    trainer, pl_module = fake_run(quickstart_model_dir)
    with pytest.raises(ModuleNotFoundError, match="cannot import engine module 'no_such_engines_module'"):
        RolloutCallback(engine=EngineSettings(modules=["no_such_engines_module"])).setup(trainer, pl_module, "fit")
    with pytest.raises(FileNotFoundError, match=r"engine module file .*missing_engines\.py"):
        missing = EngineSettings(modules=[str(tmp_path / "missing_engines.py")])
        RolloutCallback(engine=missing).setup(trainer, pl_module, "fit")


def test_callback_loads_an_engine_module_by_path(quickstart_model_dir, tmp_path):
    module = tmp_path / "path_engines_for_test.py"
    module.write_text(
        "from lit_agentrl.engines import register_engine\n"
        "from lit_agentrl.engines.hf import TransformersEngine\n"
        "@register_engine('path_engine_for_test')\n"
        "class PathEngine(TransformersEngine):\n"
        "    pass\n"
    )
    callback = RolloutCallback(engine=EngineSettings("path_engine_for_test", modules=[str(module)]))
    trainer, pl_module = fake_run(quickstart_model_dir)
    callback.setup(trainer, pl_module, "fit")
    try:
        assert callback.step is not None and type(callback.step.fleet.engines[0]).__name__ == "PathEngine"
    finally:
        callback.teardown(trainer, pl_module, "fit")
        sys.modules.pop("path_engines_for_test", None)


@pytest.mark.slow
def test_a_fit_generates_and_syncs_through_the_users_engine(tmp_path, quickstart_model_dir):
    import yaml
    from support import quick_config

    from lit_agentrl.cli import main

    config = quick_config(tmp_path, quickstart_model_dir, steps=1)
    settings = yaml.safe_load(config.read_text())
    settings["trainer"]["callbacks"][0]["init_args"].update(
        {"engine": {"name": "recording_engine_for_tests", "modules": [__name__]}}
    )
    config.write_text(yaml.safe_dump(settings))
    BUILT.clear()
    main(["fit", "--config", str(config)])
    (engine,) = BUILT
    assert engine.requests >= 16 and engine.updates >= 1  # 4 prompts x 4 samples, then the weight sync


def test_an_engine_named_alone_is_the_group_with_that_name():
    assert RolloutCallback(engine="sglang").settings.engine == EngineSettings(name="sglang")
    with pytest.raises(ValueError, match=r"RolloutCallback\.engine\.max_inflight must be >= 1"):
        EngineSettings(max_inflight=0)
