"""Colocated mode's memory cycle (lit_agentrl.rollout.colocation): the order in which the trainer and the engine
hand the GPU to each other, and a whole colocated fit on CPU that trains exactly what a plain one trains."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from support import quick_config, read_csv

from lit_agentrl.cli import main
from lit_agentrl.config.rollout import EngineSettings
from lit_agentrl.engines import RolloutEngine
from lit_agentrl.rollout.colocation import ColocatedCycle
from lit_agentrl.rollout.fleet import EngineFleet


class RecordingEngine(RolloutEngine):
    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def async_generate(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def update_weights_from_tensor(self, named_tensors: Any, load_format: Any = None, flush_cache: bool = True):
        self.events.append("update weights")
        return True, ""

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.events.append(f"resume {','.join(tags or [])}")

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.events.append(f"release {','.join(tags or [])}")


class RecordingState:
    """Stands in for a TrainerOffload: records which part moves when."""

    def __init__(self, events: list[str]) -> None:
        self.events, self.offloaded_bytes = events, 0

    def offload_optimizer(self) -> int:
        self.events.append("offload optimizer")
        return 0

    def offload_parameters(self) -> int:
        self.events.append("offload parameters")
        self.offloaded_bytes = 10**9
        return 0

    def restore(self) -> int:
        self.events.append("restore")
        self.offloaded_bytes = 0
        return 0


def cycle(device: str, events: list[str], monkeypatch) -> ColocatedCycle:
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    return ColocatedCycle([RecordingEngine(events)], torch.device(device), [RecordingState(events)])  # type: ignore[list-item]


def test_a_window_offloads_the_trainer_around_the_sync_and_gives_the_engine_its_memory(monkeypatch):
    events: list[str] = []
    colocated = cycle("cuda", events, monkeypatch)
    colocated.enter(sync=lambda: events.append("sync"))  # an engine that was never released: nothing to resume
    assert events == ["offload optimizer", "sync", "offload parameters", "empty_cache"]
    assert colocated.open and colocated.offloaded_gb == 1.0
    events.clear()
    colocated.leave()
    assert events == ["release kv_cache,weights", "restore"] and not colocated.open
    events.clear()
    colocated.leave()  # closing a closed window does nothing
    assert events == []
    colocated.enter(sync=lambda: events.append("sync"))
    assert events == [
        "offload optimizer",  # not needed by the sync, and the largest part
        "empty_cache",  # the trainer's cached peak goes back before SGLang takes its weights
        "resume weights",
        "sync",  # the parameters are still on the GPU for the gather
        "offload parameters",
        "empty_cache",
        "resume kv_cache",
    ]


def test_on_cpu_no_cache_is_emptied(monkeypatch):
    events: list[str] = []
    colocated = cycle("cpu", events, monkeypatch)
    colocated.enter(sync=lambda: None)
    colocated.leave()
    colocated.enter(sync=lambda: None)
    assert "empty_cache" not in events and events.count("resume weights") == 1


def test_every_window_after_a_release_pushes_the_weights_again():
    """SGLang drops released weights: a validation window right after a training rollout (no update in between)
    must still push them, and so must the first window after setup, where the engine is released at once."""
    events: list[str] = []
    fleet = EngineFleet([RecordingEngine(events)], colocate=True)
    assert events == ["release kv_cache,weights"]  # at once: the trainer loads on a free GPU
    events.clear()
    policy, cpu = torch.nn.Linear(2, 2), torch.device("cpu")
    assert fleet.prepare(cpu, policy, version=0) is not None  # the first window pushes
    assert events == ["resume weights", "update weights", "resume kv_cache"]
    assert fleet.prepare(cpu, policy, version=0) is None  # the window is open and the weights current
    assert events.count("update weights") == 1
    fleet.close_window()
    events.clear()
    assert fleet.prepare(cpu, policy, version=0) is not None  # the policy did not change, but SGLang dropped it
    assert events == ["resume weights", "update weights", "resume kv_cache"]
    assert fleet.engines[0].weight_version == 0 and fleet.pushes == 2


def test_offload_trainer_needs_colocate():
    with pytest.raises(ValueError, match="offload_trainer needs colocate: true"):
        EngineSettings(offload_trainer=True)
    assert EngineSettings(colocate=True).offloads and not EngineSettings().offloads
    assert not EngineSettings(colocate=True, offload_trainer=False).offloads


@pytest.mark.slow
def test_a_colocated_fit_trains_what_a_plain_fit_trains(tmp_path, quickstart_model_dir):
    """The transformers engine on CPU, colocated: the trainer's states go to (other) host memory during every
    rollout and validation, and come back bit-exactly; the sync moves to the start of the next step."""
    weights, rows = {}, {}
    for colocate in (False, True):
        run = tmp_path / f"colocate-{colocate}"
        run.mkdir()
        # Batches by arrival would depend on timing (and the colocated cycle changes timing): bits would too.
        config = quick_config(
            run, quickstart_model_dir, steps=3, engine_kwargs={"deterministic": True}, val_check_interval=2,
            check_val_every_n_epoch=None,
        )  # fmt: skip
        settings = yaml.safe_load(config.read_text())
        settings["trainer"]["callbacks"][0]["init_args"]["engine"]["colocate"] = colocate
        settings["trainer"]["callbacks"].append(
            {
                "class_path": "lit_agentrl.callbacks.export.HFExportCallback",
                "init_args": {"dirpath": str(run / "export")},
            }
        )
        config.write_text(yaml.safe_dump(settings))
        main(["fit", "--config", str(config)])
        rows[colocate] = [r for r in read_csv(next((run / "logs").rglob("metrics.csv"))) if r.get("train/loss")]
        weights[colocate] = load_file(next((run / "export" / "final").glob("*.safetensors")))
    assert weights[True].keys() == weights[False].keys()
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in weights[False])
    assert [r["train/loss"] for r in rows[True]] == [r["train/loss"] for r in rows[False]]
    assert all(float(r["memory/offloaded_gb"]) > 0 for r in rows[True])
    assert all("memory/offloaded_gb" not in r or r["memory/offloaded_gb"] in ("", None) for r in rows[False])
