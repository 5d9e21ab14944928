"""Engine placement: which rank starts which engine on which GPUs, and how a trainer's ranks reach the engines.

The arithmetic is pure; the wiring is checked with engines that record what they would launch (SGLang's
``ServerArgs``, the transformers engine's ``device``), so no GPU and no SGLang are needed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest

from lit_agentrl.callbacks import RolloutCallback
from lit_agentrl.callbacks.ranks import engine_placement
from lit_agentrl.config.rollout import EngineSettings
from lit_agentrl.engines import build_engines, register_engine
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.engines.sglang import SGLangEngine, SGLangHTTPEngine
from lit_agentrl.training.module import GRPOModule


def node(tp_size: int, local_world_size: int = 8, nodes: int = 1) -> list[EnginePlacement]:
    """Every rank's placement, in global-rank order (Lightning's layout: node by node)."""
    world = local_world_size * nodes
    return [EnginePlacement(g, g % local_world_size, local_world_size, world, tp_size) for g in range(world)]


def engines_of(plans: list[EnginePlacement]) -> list[tuple[int, int, tuple[int, ...]]]:
    """(node, base_gpu_id, GPUs) of every engine started, in order."""
    return [(p.node_rank, p.base_gpu_id, p.gpu_ids) for p in plans if p.starts_engine]


# ---------------------------------------------------------------------- the arithmetic


def test_tp1_one_engine_per_rank_on_its_own_gpu():
    plans = node(tp_size=1)
    assert engines_of(plans) == [(0, r, (r,)) for r in range(8)]
    assert [p.group for p in plans] == [(r,) for r in range(8)]
    assert [p.engine_index for p in plans] == list(range(8))
    assert all(p.starts_engine and p.pushes_weights for p in plans)
    assert {p.num_engines for p in plans} == {8}


def test_tp2_pairs_of_ranks_share_an_engine_started_and_fed_by_the_first():
    plans = node(tp_size=2)
    assert engines_of(plans) == [(0, 0, (0, 1)), (0, 2, (2, 3)), (0, 4, (4, 5)), (0, 6, (6, 7))]
    assert [p.group for p in plans] == [(0, 1), (0, 1), (2, 3), (2, 3), (4, 5), (4, 5), (6, 7), (6, 7)]
    assert [p.base_gpu_id for p in plans] == [0, 0, 2, 2, 4, 4, 6, 6]
    assert [p.engine_index for p in plans] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [p.global_rank for p in plans if p.pushes_weights] == [0, 2, 4, 6]
    assert {p.num_engines for p in plans} == {4}


def test_tp4_two_engines_per_node():
    plans = node(tp_size=4)
    assert engines_of(plans) == [(0, 0, (0, 1, 2, 3)), (0, 4, (4, 5, 6, 7))]
    assert [p.engine_index for p in plans] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [p.global_rank for p in plans if p.pushes_weights] == [0, 4]
    assert all(p.group == ((0, 1, 2, 3) if p.local_rank < 4 else (4, 5, 6, 7)) for p in plans)


def test_two_nodes_of_8_with_tp2_number_engines_node_by_node():
    plans = node(tp_size=2, nodes=2)
    assert engines_of(plans) == [(n, g, (g, g + 1)) for n in (0, 1) for g in (0, 2, 4, 6)]
    assert [p.engine_index for p in plans] == [i // 2 for i in range(16)]
    assert [p.global_rank for p in plans if p.pushes_weights] == [0, 2, 4, 6, 8, 10, 12, 14]
    second = plans[11]  # node 1, local rank 3: shares the engine that local rank 2 (global 10) starts on GPUs 2-3
    assert (second.node_rank, second.group, second.base_gpu_id, second.starts_engine) == (1, (2, 3), 2, False)
    assert {p.num_engines for p in plans} == {8}


@pytest.mark.parametrize("tp_size", [1, 2, 4, 8])
def test_the_engines_of_a_node_use_each_gpu_exactly_once(tp_size):
    used = [gpu for _, _, gpus in engines_of(node(tp_size)) for gpu in gpus]
    assert sorted(used) == list(range(8))


def test_a_rank_alone_on_its_node_runs_a_tp_engine_from_its_own_gpu():
    plan = EnginePlacement(0, 0, 1, 1, tp_size=4)
    assert (plan.group, plan.starts_engine, plan.base_gpu_id, plan.gpu_ids) == ((0,), True, 0, (0, 1, 2, 3))
    assert (plan.engine_index, plan.num_engines, plan.pushes_weights) == (0, 1, True)
    other_node = EnginePlacement(1, 0, 1, 2, tp_size=2)  # 2 nodes of 1 rank: an engine per node
    assert (other_node.engine_index, other_node.num_engines, other_node.base_gpu_id) == (1, 2, 0)


def test_tp_size_must_divide_the_ranks_of_a_node():
    with pytest.raises(ValueError, match=r"engine\.kwargs\.tp_size=3 does not divide the 8 ranks per node"):
        EnginePlacement(0, 0, 8, 8, tp_size=3)
    with pytest.raises(ValueError, match=r"engine\.kwargs\.tp_size=16 does not divide the 8 ranks per node"):
        EnginePlacement(0, 0, 8, 8).with_tp_size(16)
    with pytest.raises(ValueError, match=r"engine\.kwargs\.tp_size must be >= 1, got 0"):
        EnginePlacement(0, 0, 8, 8, tp_size=0)


def test_ranks_out_of_range_are_refused():
    with pytest.raises(ValueError, match="local rank 8 of 8 ranks per node"):
        EnginePlacement(8, 8, 8, 16)
    with pytest.raises(ValueError, match="global rank 8 of 8"):
        EnginePlacement(8, 0, 8, 8)
    with pytest.raises(ValueError, match="8 ranks per node and 4 ranks in all"):
        EnginePlacement(0, 0, 8, 4)


def test_placement_is_a_frozen_value():
    plan = EnginePlacement(3, 3, 8, 8)
    assert plan.with_tp_size(2) == EnginePlacement(3, 3, 8, 8, tp_size=2) and plan.tp_size == 1
    with pytest.raises(AttributeError):
        plan.tp_size = 2  # type: ignore[misc]


# ---------------------------------------------------------------------- what the engines are given

LAUNCHED: list[dict[str, Any]] = []
TRANSFORMERS_BUILT: list[dict[str, Any]] = []


@register_engine("recording_sglang_for_placement_tests")
class RecordingSGLangEngine(SGLangEngine):
    """The in-process SGLang engine, recording the ``ServerArgs`` it would launch instead of launching SGLang."""

    def _launch(self, **server_args: Any) -> Any:
        LAUNCHED.append(server_args)
        return SimpleNamespace(loop=None, shutdown=lambda: None)


class RecordingTransformersEngine(TransformersEngine):
    """The transformers engine's ``build``, recording the constructor's arguments instead of loading a model."""

    def __init__(self, model_path: str, seed: int = 0, **kwargs: Any) -> None:
        TRANSFORMERS_BUILT.append(kwargs)


@pytest.fixture(autouse=True)
def _clear_records(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    LAUNCHED.clear(), TRANSFORMERS_BUILT.clear()


def launch(tiny_model_dir: Path, placement: EnginePlacement | None, **engine_kwargs: Any) -> dict[str, Any]:
    LAUNCHED.clear()
    build_engines("recording_sglang_for_placement_tests", str(tiny_model_dir), placement=placement, **engine_kwargs)
    (server_args,) = LAUNCHED
    return server_args


def test_sglang_on_cuda_starts_each_ranks_engine_on_the_ranks_gpu(tiny_model_dir):
    gpus = [launch(tiny_model_dir, plan, device="cuda")["base_gpu_id"] for plan in node(tp_size=1)]
    assert gpus == list(range(8))
    server_args = launch(tiny_model_dir, EnginePlacement(3, 3, 8, 8), device="cuda", mem_fraction_static=0.5)
    assert {k: server_args[k] for k in ("base_gpu_id", "tp_size", "device", "mem_fraction_static")} == {
        "base_gpu_id": 3,
        "tp_size": 1,
        "device": "cuda",
        "mem_fraction_static": 0.5,
    }


def test_sglang_places_itself_when_it_will_detect_cuda(tiny_model_dir, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert launch(tiny_model_dir, EnginePlacement(5, 5, 8, 8))["base_gpu_id"] == 5
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert "base_gpu_id" not in launch(tiny_model_dir, EnginePlacement(5, 5, 8, 8))


def test_sglang_on_cpu_or_outside_a_trainer_is_not_placed(tiny_model_dir):
    assert "base_gpu_id" not in launch(tiny_model_dir, EnginePlacement(3, 3, 8, 8), device="cpu")
    assert "base_gpu_id" not in launch(tiny_model_dir, None, device="cuda")


def test_each_ranks_engine_gets_a_rendezvous_port_and_a_sampling_seed_of_its_own(tiny_model_dir, monkeypatch):
    """SGLang alone draws its scheduler's rendezvous port from Python's global ``random``, seeded alike on every rank
    (tests/engines/test_sglang_ranks.py shows the collision with real engines); each rank's engine gets its own."""
    taken = 30103  # one port in use
    monkeypatch.setattr("lit_agentrl.engines.sglang_placement._port_is_free", lambda port: port != taken)
    started = []
    for plan in node(tp_size=1):
        LAUNCHED.clear()
        build_engines("recording_sglang_for_placement_tests", str(tiny_model_dir), seed=7, placement=plan)
        started.append(LAUNCHED[0])
    assert [s["random_seed"] for s in started] == list(range(7, 15))  # the run's seed + the global rank
    assert [s["nccl_port"] for s in started] == [30100, 30101, 30102, 30111, 30104, 30105, 30106, 30107]
    assert launch(tiny_model_dir, EnginePlacement(3, 3, 8, 8), nccl_port=31000)["nccl_port"] == 31000  # kept
    assert "nccl_port" not in launch(tiny_model_dir, None)  # outside a trainer: SGLang's own choice


def test_an_explicit_base_gpu_id_is_kept_and_logged(tiny_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="lit_agentrl.engines.sglang_placement"):
        server_args = launch(tiny_model_dir, EnginePlacement(3, 3, 8, 8), device="cuda", base_gpu_id=6)
    assert server_args["base_gpu_id"] == 6
    assert "engine.kwargs.base_gpu_id=6 is kept (the placement would be GPU 3)" in caplog.text


STARTED: list[list[str]] = []


@pytest.fixture()
def group_servers(monkeypatch):
    """The group path without SGLang: record each server command, answer every health check."""
    from lit_agentrl.engines import sglang_group

    STARTED.clear()

    def start(command: list[str], env: dict[str, str] | None = None) -> Any:
        STARTED.append(command)
        return SimpleNamespace(pid=-1, poll=lambda: None)

    monkeypatch.setattr(sglang_group, "start_server", start)
    monkeypatch.setattr(sglang_group, "wait_until_healthy", lambda url, server, timeout_s=0: None)
    monkeypatch.setattr(sglang_group, "stop_server", lambda server: None)
    return STARTED


def options(command: list[str]) -> dict[str, str]:
    """``--key value`` pairs of a command line (bare flags map to "")."""
    out, key = {}, None
    for part in command[3:]:
        if part.startswith("--"):
            key = part[2:]
            out[key] = ""
        elif key is not None:
            out[key] = part
    return out


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_8_ranks_reach_their_groups_engine_and_its_first_rank_starts_and_feeds_it(
    tiny_model_dir, group_servers, tp_size
):
    engines = [
        build_engines(
            "recording_sglang_for_placement_tests",
            str(tiny_model_dir),
            seed=7,
            placement=EnginePlacement(rank, rank, 8, 8),
            device="cuda",
            tp_size=tp_size,
            mem_fraction_static=0.5,
            enable_memory_saver=True,
        )[0]
        for rank in range(8)
    ]
    if tp_size == 1:  # one in-process engine per rank, on the rank's own GPU; no server
        assert group_servers == [] and [a["base_gpu_id"] for a in LAUNCHED] == list(range(8))
        assert all(e.owner and not e.shared for e in engines)
        return
    assert LAUNCHED == []  # no in-process engine: every rank is a client of its group's server
    groups = [rank // tp_size for rank in range(8)]
    assert [e.url for e in engines] == [f"http://127.0.0.1:{30000 + g}" for g in groups]  # which rank talks to which
    assert [rank for rank, e in enumerate(engines) if e.owner] == list(range(0, 8, tp_size))  # who pushes weights
    assert all(e.shared and e.tp_size == tp_size and e.transport == "ipc" for e in engines)
    started = [options(command) for command in group_servers]  # what each engine receives
    assert [o["base-gpu-id"] for o in started] == [str(first) for first in range(0, 8, tp_size)]
    assert [o["port"] for o in started] == [str(30000 + i) for i in range(8 // tp_size)]
    assert [o["nccl-port"] for o in started] == [str(30100 + i) for i in range(8 // tp_size)]
    assert [o["random-seed"] for o in started] == [str(7 + first) for first in range(0, 8, tp_size)]  # apart
    for o in started:
        assert (o["tp-size"], o["device"], o["mem-fraction-static"]) == (str(tp_size), "cuda", "0.5")
        assert o["enable-memory-saver"] == o["skip-tokenizer-init"] == "" and o["model-path"] == str(tiny_model_dir)
    for engine in engines:
        engine.shutdown()


def test_group_port_and_cpu_servers(tiny_model_dir, group_servers):
    (engine,) = build_engines(
        "sglang", str(tiny_model_dir), placement=EnginePlacement(3, 3, 4, 4), device="cpu", tp_size=2, group_port=31000
    )
    assert engine.url == "http://127.0.0.1:31001" and not engine.owner and group_servers == []
    (engine,) = build_engines(
        "sglang", str(tiny_model_dir), placement=EnginePlacement(2, 2, 4, 4), device="cpu", tp_size=2, group_port=31000
    )
    (command,) = group_servers
    assert engine.owner and "base-gpu-id" not in options(command)  # on CPU SGLang reads it as a NUMA node


def test_sglang_tp_above_1_on_a_single_rank_starts_from_its_gpu(tiny_model_dir):
    server_args = launch(tiny_model_dir, EnginePlacement(0, 0, 1, 1), device="cuda", tp_size=2)
    assert (server_args["base_gpu_id"], server_args["tp_size"]) == (0, 2)


def test_sglang_http_ignores_the_placement(tiny_model_dir):
    engines = build_engines(
        "sglang_http", str(tiny_model_dir), placement=EnginePlacement(3, 3, 8, 8), urls=["http://a:1"], tp_size=4
    )
    assert [(type(e), e.url, e.tp_size) for e in engines] == [(SGLangHTTPEngine, "http://a:1", 4)]
    engines[0].shutdown()


@pytest.mark.parametrize(
    ("device", "placement", "expected"),
    [
        ("cuda", EnginePlacement(3, 3, 8, 8), "cuda:3"),
        ("cuda", None, "cuda"),
        ("cuda:1", EnginePlacement(3, 3, 8, 8), "cuda:1"),
        ("cpu", EnginePlacement(3, 3, 8, 8), "cpu"),
    ],
)
def test_transformers_engine_on_cuda_takes_the_ranks_gpu(device, placement, expected):
    RecordingTransformersEngine.build("unused", placement=placement, device=device)
    (kwargs,) = TRANSFORMERS_BUILT
    assert kwargs == {"device": expected}


def test_transformers_engine_without_a_device_keeps_its_default():
    RecordingTransformersEngine.build("unused", placement=EnginePlacement(3, 3, 8, 8), dtype="float32")
    (kwargs,) = TRANSFORMERS_BUILT
    assert kwargs == {"dtype": "float32"}


# ---------------------------------------------------------------------- the callback


def fake_trainer(global_rank: int = 3, local_rank: int = 3, num_devices: int = 8, world_size: int = 8) -> Any:
    return SimpleNamespace(
        global_rank=global_rank,
        local_rank=local_rank,
        num_devices=num_devices,
        world_size=world_size,
        datamodule=SimpleNamespace(reward_fn=None),
    )


def test_callback_builds_the_ranks_engine_on_its_gpu(quickstart_model_dir):
    callback = RolloutCallback(
        engine=EngineSettings(
            "recording_sglang_for_placement_tests", {"device": "cuda", "mem_fraction_static": 0.5}, [__name__]
        )
    )
    trainer, pl_module = fake_trainer(), GRPOModule(str(quickstart_model_dir))
    callback.setup(trainer, pl_module, "fit")
    try:
        (server_args,) = LAUNCHED
        assert (server_args["base_gpu_id"], server_args["tp_size"], server_args["device"]) == (3, 1, "cuda")
        assert server_args["model_path"] == str(quickstart_model_dir) and server_args["mem_fraction_static"] == 0.5
    finally:
        callback.teardown(trainer, pl_module, "fit")


def test_callback_builds_a_group_client_for_a_shared_tp_engine(quickstart_model_dir, group_servers):
    callback = RolloutCallback(
        engine=EngineSettings("recording_sglang_for_placement_tests", {"device": "cuda", "tp_size": 2})
    )
    trainer, pl_module = fake_trainer(), GRPOModule(str(quickstart_model_dir))
    callback.setup(trainer, pl_module, "fit")  # rank 3 of 8: the second rank of the group that rank 2 starts
    try:
        assert callback.step is not None
        (engine,) = callback.step.fleet.engines
        assert (engine.url, engine.owner, group_servers) == ("http://127.0.0.1:30001", False, [])
    finally:
        callback.teardown(trainer, pl_module, "fit")


def test_ranks_per_node_come_from_local_world_size_else_the_trainers_devices(monkeypatch):
    assert engine_placement(fake_trainer()) == EnginePlacement(3, 3, 8, 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert engine_placement(fake_trainer(global_rank=7, world_size=8)) == EnginePlacement(7, 3, 4, 8)


def test_a_real_trainers_placement():
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    assert engine_placement(trainer) == EnginePlacement(0, 0, 1, 1)


def test_a_server_that_exits_before_it_is_healthy_is_reported_with_the_end_of_its_log(tmp_path, monkeypatch):
    """A group's or pool's server that dies while starting (SGLang kills its own tree, exit -9, when a worker fails)
    is named with the last lines of its output, which otherwise only its own console held."""
    import sys
    import tempfile

    from lit_agentrl.engines import sglang_group

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its log lands here, not in the machine's /tmp
    program = "import sys; [print(f'line {i}') for i in range(100)]; print('scheduler died: boom', file=sys.stderr); sys.exit(3)"
    server = sglang_group.start_server([sys.executable, "-c", program])
    with pytest.raises(RuntimeError, match="exited with code 3") as raised:
        sglang_group.wait_until_healthy("http://127.0.0.1:9", server, timeout_s=60)
    message = str(raised.value)
    assert "scheduler died: boom" in message and "line 99" in message
    assert "line 10\n" not in message  # only the end of the log
    assert server.log_path is not None and server.log_path.parent == tmp_path
