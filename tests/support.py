"""Test doubles and helpers that need no network. Imported by tests as ``support`` (tests/ is on sys.path)."""

from __future__ import annotations

import asyncio
import csv
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch

from lit_agentrl.config.run_file import cpu_run, write_config
from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.types import Trajectory

REPO_ROOT = Path(__file__).resolve().parents[1]
MATH_SAMPLE_TRAIN = REPO_ROOT / "data" / "samples" / "math_sample_train.jsonl"
MATH_SAMPLE_TEST = REPO_ROOT / "data" / "samples" / "math_sample_test.jsonl"
MATH_EVAL_CFG = REPO_ROOT / "configs" / "agents" / "math_eval.yaml"
SGLANG_SHIM = REPO_ROOT / "tests" / "sglang_shim"
# SGLang on CPU: the facts measured for 0.5.23 (torch_native attention, float32, a small KV cache).
SGLANG_CPU = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "dtype": "float32",
    "mem_fraction_static": 0.05,
    "max_total_tokens": 4096,
}


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch threads: CPU matmuls round differently with another count, so a bit-for-bit
    comparison fixes it on every side (the engine process takes ``threads=`` for its own)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def require_sglang() -> None:
    """Skip without SGLang, except where LIT_AGENTRL_REQUIRE_SGLANG=1 (CI's SGLang run): there, fail."""
    import importlib.util
    import os

    import pytest

    if importlib.util.find_spec("sglang") is None:
        if os.environ.get("LIT_AGENTRL_REQUIRE_SGLANG") == "1":
            pytest.fail("SGLang is not importable in this environment (see scripts/build_sglang_env.sh)")
        pytest.skip("SGLang is not installed here; .ci/run runs these tests in the SGLang environment")


class ScriptedEngine(RolloutEngine):
    """An engine whose policy "chooses" scripted replies, scored by the real tiny model.

    A random-init model never writes a valid tool call, so multi-turn tests script what the model says;
    everything else is real: token ids come from the real tokenizer, logprobs from the real model's
    forward pass over exactly those tokens, and the output is in SGLang's format. ``calls`` records the
    input ids of each request, so tests can check what the engine was asked.
    """

    def __init__(self, model: Any, tokenizer: Any, replies: Sequence[str | list[int]]) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.replies = list(replies)
        self.calls: list[list[int]] = []

    async def async_generate(self, input_ids=None, sampling_params=None, return_logprob=False, **kwargs):
        params = SamplingParams.of(sampling_params)
        self.calls.append(list(input_ids))
        reply = self.replies.pop(0)
        ids = reply if isinstance(reply, list) else self.tokenizer.encode(reply, add_special_tokens=False)
        ids = [*ids, self.tokenizer.eos_token_id]
        finish: dict = {"type": "stop", "matched": self.tokenizer.eos_token_id}
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], {"type": "length", "length": params.max_new_tokens}
        await asyncio.sleep(0)
        meta = {"finish_reason": finish, "prompt_tokens": len(input_ids), "completion_tokens": len(ids)}
        if return_logprob:
            meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(self.score(input_ids, ids), ids)]
        return {"output_ids": ids, "meta_info": meta}

    @torch.no_grad()
    def score(self, prompt: list[int], output: list[int]) -> list[float]:
        full = torch.tensor([prompt + output])
        logprobs = torch.log_softmax(self.model(full).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
        return logprobs.gather(-1, torch.tensor(output).unsqueeze(-1)).squeeze(-1).tolist()

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        return True, "scripted engine keeps no weights of its own"

    def flush_cache(self) -> bool:
        return True

    def release_memory_occupation(self, tags=None) -> None: ...

    def resume_memory_occupation(self, tags=None) -> None: ...

    def shutdown(self) -> None: ...


def tool_call_text(name: str, arguments: dict) -> str:
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


FSDP_TWO_RANKS = {
    "class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
    "init_args": {"data_parallel_size": 2, "tensor_parallel_size": 1},
}
"""Two FSDP2 ranks (``trainer.strategy``), gloo on CPU."""


def quick_config(
    tmp_path: Path,
    model_dir: Path,
    steps: int,
    callbacks: list[dict] | None = None,
    n_samples: int = 4,
    engine_kwargs: dict | None = None,  # RolloutCallback.engine.kwargs
    **trainer,
) -> Path:
    """The quickstart's shape, made small: 4 prompts x ``n_samples`` samples per step."""
    config = cpu_run(
        model_dir,
        tmp_path,
        max_steps=steps,
        rollout={
            "engine": {"name": "transformers", "kwargs": engine_kwargs or {}},
            "train": {"n_samples": n_samples, "sampling_params": {"max_new_tokens": 4, "temperature": 1.0}},
            "validation": {"sampling_params": {"max_new_tokens": 4, "temperature": 0.0}},
        },
        model={"optimizer": {"lr": 5.0e-4}},
        data={
            "train_files": str(REPO_ROOT / "data/quickstart/train.jsonl"),
            "val_files": str(REPO_ROOT / "data/quickstart/val.jsonl"),
            "prompts_per_step": 4,
            "val_prompts_per_step": 10,
        },
        callbacks=callbacks or (),
        **trainer,
    )
    return write_config(config, tmp_path / "config.yaml")


def short_fit(config: str | Path, model_dir: Path, save_dir: Path, steps: int = 3) -> list[dict]:
    """``lit-agentrl fit --config config`` on ``model_dir`` for ``steps`` steps (validating at the last), its CSV log
    in ``save_dir``: its metrics rows (training steps and validations)."""
    from lit_agentrl.cli import main

    args = ["--model.model_path", str(model_dir), "--trainer.max_steps", str(steps)]
    args += ["--trainer.val_check_interval", str(steps), "--trainer.enable_progress_bar", "false"]
    main(["fit", "--config", str(config), *args, "--trainer.logger.init_args.save_dir", str(save_dir)])
    return read_csv(next(save_dir.rglob("metrics.csv")))


def fit_rows(
    tmp_path: Path,
    model_dir: Path,
    rows: Sequence[dict],
    *,
    steps: int = 2,
    n_samples: int = 2,
    max_new_tokens: int = 8,
    rollout: dict | None = None,
) -> tuple[list[dict], list[dict]]:
    """``lit-agentrl fit`` on ``rows`` (every row each step, and as the validation set) for ``steps`` steps, every
    trajectory logged: the CSV's metrics rows and the trajectory log's records. ``rollout``: more RolloutCallback
    settings."""
    import json

    from lit_agentrl.cli import main

    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = cpu_run(
        model_dir,
        tmp_path,
        max_steps=steps,
        rollout={
            "train": {
                "n_samples": n_samples,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0},
            },
            "validation": {"sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0}},
            "health": {"template_drift": False},
            **(rollout or {}),
        },
        model={"optimizer": {"lr": 5.0e-4}},
        data={"train_files": str(data), "val_files": str(data), "prompts_per_step": len(rows), "shuffle": False},
        callbacks=[{"class_path": "lit_agentrl.callbacks.TrajectoryLog", "init_args": {"max_per_step": None}}],
        val_check_interval=steps,
        check_val_every_n_epoch=None,
    )
    main(["fit", "--config", str(write_config(config, tmp_path / "config.yaml"))])
    logs = tmp_path / "logs"
    records = [json.loads(line) for path in sorted(logs.rglob("rank*.jsonl")) for line in path.open()]
    return read_csv(next(logs.rglob("metrics.csv"))), records


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def free_port() -> int:
    """A TCP port nobody listens on now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_with_partner(gap: int) -> int:
    """A port p below the kernel's ephemeral range (where no outgoing connection can take it meanwhile) such that p
    and p + gap are both free now: a group's server listens on p and its workers rendezvous on p + gap."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low = min(20000, first_ephemeral // 2)
    for port in random.Random().sample(range(low, first_ephemeral - gap), 200):
        with suppress(OSError), socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", port))
            b.bind(("127.0.0.1", port + gap))
            return port
    raise RuntimeError(f"no free pair of ports {gap} apart below {first_ephemeral}")


def start_http_server(model_dir: Path, port: int, extra_args: Sequence[str] = ()) -> subprocess.Popen:
    """An SGLang server on CPU over ``model_dir`` (run in the SGLang environment), as users launch one (with the
    environment the README asks for: ``lit_agentrl.engines.sglang.server_env``), with ``extra_args`` added."""
    from lit_agentrl.engines.sglang import server_env

    env = {
        **os.environ,
        **server_env(str(model_dir)),
        "SGLANG_USE_CPU_ENGINE": "1",
        "PYTHONPATH": os.pathsep.join([str(SGLANG_SHIM), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_dir),
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--dtype",
        "float32",
        "--skip-tokenizer-init",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-total-tokens",
        "4096",
        "--mem-fraction-static",
        "0.05",
        "--random-seed",
        "0",
        "--log-level",
        "warning",
        *extra_args,
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@contextmanager
def running_http_engine(
    model_dir: Path, timeout_s: float | None = None, extra_args: Sequence[str] = ()
) -> Iterator[Any]:
    """An SGLang server over ``model_dir`` (:func:`start_http_server`) and an ``SGLangHTTPEngine`` on it; both stopped
    afterwards. A server that dies while starting fails with the end of its log; one that never becomes healthy fails
    after ``timeout_s`` (default: the project's own server start limit, generous for a loaded machine)."""
    from lit_agentrl.engines.sglang import SGLangHTTPEngine
    from lit_agentrl.engines.sglang_group import STARTUP_TIMEOUT_S, wait_until_healthy

    timeout_s = STARTUP_TIMEOUT_S if timeout_s is None else timeout_s
    port = free_port()
    server = start_http_server(model_dir, port, extra_args)
    try:
        try:
            wait_until_healthy(f"http://127.0.0.1:{port}", server, timeout_s=timeout_s)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {server.stderr.read().decode()[-3000:]}") from exc
        engine = SGLangHTTPEngine(f"http://127.0.0.1:{port}", str(model_dir))
        try:
            yield engine
        finally:
            engine.shutdown()
    finally:
        stop_server(server)


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if the server has not exited a minute later (one still starting may ignore SIGTERM)."""
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=60)


CHROMIUM_INSTALL = (
    "`apt-get install -y chromium` and `pip install playwright==1.65.2` (not `playwright install`: the test drives "
    "the system's Chromium)"
)


def chromium_path() -> str:
    """The system Chromium's path. Without it (or Playwright) the test skips, saying so, except where
    LIT_AGENTRL_REQUIRE_BROWSER=1 (CI, which installs Chromium): there it fails."""
    import importlib.util
    import shutil

    import pytest

    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path and importlib.util.find_spec("playwright") is not None:
        return path
    if os.environ.get("LIT_AGENTRL_REQUIRE_BROWSER") == "1":
        pytest.fail(
            f"LIT_AGENTRL_REQUIRE_BROWSER=1, and the viewer's browser test needs Chromium and Playwright: {CHROMIUM_INSTALL}"
        )
    pytest.skip(f"no Chromium here: the browser tests need {CHROMIUM_INSTALL}; .ci/run installs it")


def without_bubblewrap(monkeypatch: Any) -> None:
    """Simulate a machine where the sandbox's boundary cannot be built (no bubblewrap): the probe is redone."""
    from lit_agentrl.tools import execute
    from lit_agentrl.tools.sandbox import runner

    monkeypatch.setattr(runner, "_probe_cache", {})
    monkeypatch.setattr(runner, "boundary_missing", lambda: "missing bwrap (Debian: apt-get install bubblewrap)")
    monkeypatch.setattr(execute, "_sandboxes", {})


SMG = Path(os.environ.get("LIT_AGENTRL_SMG", Path.home() / ".cache/lit-agentrl/router-venv/bin/smg"))
"""SGLang's router, ``smg`` (``scripts/build_router_env.sh`` installs it; CI names it in ``LIT_AGENTRL_SMG``)."""


def require_router() -> None:
    """Skip without SGLang's router, except in CI's SGLang run (LIT_AGENTRL_REQUIRE_SGLANG=1): there, fail."""
    import pytest

    if not SMG.exists():
        if os.environ.get("LIT_AGENTRL_REQUIRE_SGLANG") == "1":
            pytest.fail(f"SGLang's router is not at {SMG} (scripts/build_router_env.sh builds it)")
        pytest.skip(f"SGLang's router is not at {SMG}; scripts/build_router_env.sh builds it")


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (a server's scheduler, a router's binary)."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for process in [*root.children(recursive=True), root]:
        with suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)


@contextmanager
def sglang_server(model_dir: Path, extra_args: Sequence[str] = ()) -> Iterator[tuple[str, subprocess.Popen]]:
    """An SGLang CPU server (:func:`start_http_server`) once healthy: its URL and process, killed afterwards."""
    from lit_agentrl.engines.sglang_group import wait_until_healthy

    port = free_port()
    process = start_http_server(model_dir, port, extra_args)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout_s=600)
        yield f"http://127.0.0.1:{port}", process
    finally:
        kill_tree(process.pid) if process.poll() is None else None
        stop_server(process)


@contextmanager
def smg_router(urls: list[str]) -> Iterator[str]:
    """SGLang's router over ``urls`` with the flags ``lit-agentrl pool`` gives it (and no overload veto: CPU KV caches
    are small), ready once it lists every server as ready."""
    from lit_agentrl.engines.rollout_pool import ROUTER_FLAGS, wait_until_routed

    port, metrics = free_port(), free_port()
    command = [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(metrics)]
    command += ["--worker-urls", *urls, *ROUTER_FLAGS, "--disable-worker-overload-protection"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_routed(url, urls, process, timeout_s=60.0)
        yield url
    finally:
        kill_tree(process.pid)


def two_turns(sample: int, first: int, second: int, reward: float, group: int = 0) -> Trajectory:
    """A trajectory of prompt [1, 2], a one-token model turn ``first``, a tool's answer [4, 5], a one-token model
    turn ``second``, scored ``reward``."""
    ids = [1, 2, first, 4, 5, second]
    return Trajectory(
        group=group,
        sample=sample,
        agent_name="two_turns",
        prompt_ids=[1, 2],
        all_token_ids=ids,
        loss_mask=[0, 0, 1, 0, 0, 1],
        response_logprobs=[-0.5, 0.0, 0.0, -0.5],
        reward=reward,
    )


@contextmanager
def gloo_data_parallel_module(rank: int, port: int, model_dir: str, loss: Any) -> Iterator[Any]:
    """In an ``mp.spawn`` worker of two: this rank of a gloo group, and a ``GRPOModule`` on ``model_dir`` with ``loss``
    and the two-rank data-parallel mesh ``ModelParallelStrategy`` would give it (its model not loaded). Both ranks
    meet at a barrier before the group is closed, so neither leaves while the other still talks to it."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from lit_agentrl.training.module import GRPOModule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        module = GRPOModule(model_dir, loss=loss)
        module._device_mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("data_parallel",))
        yield module
        dist.barrier()
    finally:
        dist.destroy_process_group()
