"""The seed's run (configs/qwen3_8b_math_agent.yaml) laid out in a folder as a GPU node would hold it, scaled down.

The folder is the run's working directory, so every relative path of the config holds unchanged: the model at
``pretrained_models/Qwen3-8B`` (here a tiny random Qwen3 with the project's Qwen-style chat template), the data
made from a MATH-lighteval-shaped parquet by ``data/prepare_math_lighteval.py`` into ``dataset/MATH-lighteval``,
the agent config at ``configs/agents/math_eval.yaml``, and the outputs under ``outputs/qwen3_8b``. The config is
the shipped file with only :data:`SCALE_DOWN` set (``rehearsal.yaml``); everything else runs as written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from support import REPO_ROOT, SGLANG_SHIM, free_port

from lit_agentrl.config.run_file import set_keys, write_config

CONFIG_8B = REPO_ROOT / "configs" / "qwen3_8b_math_agent.yaml"
OUTPUTS = Path("outputs/qwen3_8b")

# What changes, and why; every other key of the shipped config is used as written.
SCALE_DOWN: dict[str, Any] = {
    "trainer.accelerator": "cpu",  # no GPU: gloo instead of NCCL, the same ModelParallelStrategy (FSDP2)
    "trainer.devices": 2,  # 2 ranks, each with its own in-process SGLang engine, as the node's 8
    "trainer.strategy.init_args.data_parallel_size": 2,
    "trainer.max_steps": 6,  # 6 of 200 steps
    "trainer.val_check_interval": 3,  # 2 validation windows (every 5 of 200 on the node)
    "trainer.callbacks.ModelCheckpoint.init_args.every_n_train_steps": 3,  # a checkpoint per window (5)
    "trainer.callbacks.HFExportCallback.init_args.every_n_steps": 3,  # an export per window (50)
    # SGLang's CPU build: its own device and attention backend, a small KV cache, no memory saver (it needs CUDA).
    # Nor can it release or resume memory (SGLang 0.5.23 then calls torch.cuda.synchronize), so the engines keep
    # theirs and the weights are pushed after each step instead of in a window before each rollout; the colocated
    # cycle itself is rehearsed with the transformers engine (tests/training/test_colocate_memory.py).
    "rollout.engine.colocate": False,
    "rollout.engine.kwargs": {
        "dtype": "bfloat16",
        "device": "cpu",
        "attention_backend": "torch_native",
        "mem_fraction_static": 0.05,
        "max_total_tokens": 8192,
    },
    "rollout.train.n_samples": 4,  # 32
    "rollout.train.sampling_params.max_new_tokens": 24,  # 2048
    "rollout.validation.sampling_params.max_new_tokens": 24,
    "data.prompts_per_step": 4,  # 64
    "data.val_prompts_per_step": 4,  # 512
}
# The metrics as a CSV beside the config's (offline) wandb run, for the rehearsal's checks to read (written at
# every step: the killed run's too).
CSV_LOGGER = {
    "class_path": "lightning.pytorch.loggers.CSVLogger",
    "init_args": {"save_dir": str(OUTPUTS / "csv"), "flush_logs_every_n_steps": 1},
}

TRAIN_PROBLEMS = 16
TEST_PROBLEMS = 8


def lay_out(work: Path) -> Path:
    """The run's folder: model, data, agent config and ``rehearsal.yaml``; returns the config's path."""
    from lit_agentrl.models.tiny import save_tiny_model

    save_tiny_model(work / "pretrained_models" / "Qwen3-8B")
    (work / "configs" / "agents").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "configs" / "agents" / "math_eval.yaml", work / "configs" / "agents")
    write_math_lighteval(work / "raw" / "MATH-lighteval")
    prepare = [sys.executable, str(REPO_ROOT / "data" / "prepare_math_lighteval.py")]
    subprocess.run([*prepare, "--input_dir", "raw/MATH-lighteval", "--local_dir", "dataset/MATH-lighteval"],
                   cwd=work, check=True, capture_output=True)  # fmt: skip
    config = set_keys(yaml.safe_load(CONFIG_8B.read_text()), SCALE_DOWN)
    config["trainer"]["logger"] = [config["trainer"]["logger"], CSV_LOGGER]
    return write_config(config, work / "rehearsal.yaml")


def write_math_lighteval(folder: Path) -> None:
    """``train`` and ``test`` parquet files in MATH-lighteval's columns (problem, level, type, solution)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    for split, count in (("train", TRAIN_PROBLEMS), ("test", TEST_PROBLEMS)):
        problems = [f"What is {i} + {i + 1}?" for i in range(count)]
        solutions = [f"{i} + {i + 1} = {2 * i + 1}, so the answer is $\\boxed{{{2 * i + 1}}}$." for i in range(count)]
        table = pa.table({
            "problem": problems, "level": ["Level 1"] * count, "type": ["Algebra"] * count, "solution": solutions
        })  # fmt: skip
        pq.write_table(table, folder / f"{split}.parquet")


def environment(work: Path) -> dict[str, str]:
    """The run's environment: SGLang's CPU engine, wandb offline inside the folder."""
    return {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        "PYTHONPATH": os.pathsep.join([str(SGLANG_SHIM), os.environ.get("PYTHONPATH", "")]),
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(work / OUTPUTS),
        "WANDB_CACHE_DIR": str(work / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(work / "wandb-config"),
    }


@dataclass(frozen=True)
class Layout:
    """How the run's 2 ranks are laid out: ``nodes`` x ``ranks_per_node``."""

    nodes: int
    ranks_per_node: int

    def __str__(self) -> str:
        return f"{self.nodes}x{self.ranks_per_node}"


ONE_NODE, TWO_NODES = Layout(1, 2), Layout(2, 1)


class Run:
    """One ``lit-agentrl`` command on every node of ``layout``, each node a process in a session of its own (so a
    SIGKILL reaches its ranks and engines). Nodes beyond one are launched as Lightning's multi-node launch expects
    them on a cluster: the same command with ``num_nodes``, and ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` set.
    """

    def __init__(self, work: Path, layout: Layout, *args: str) -> None:
        self.work = work
        command = [sys.executable, "-m", "lit_agentrl.cli", *args]
        if layout.nodes > 1:
            command += ["--trainer.num_nodes", str(layout.nodes), "--trainer.devices", str(layout.ranks_per_node)]
        master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())} if layout.nodes > 1 else {}
        self.nodes = []
        for node in range(layout.nodes):
            env = {**environment(work), **master, **({"NODE_RANK": str(node)} if master else {})}
            log = open(work / f"{args[0]}-{time.monotonic_ns()}-node{node}.log", "w")  # noqa: SIM115 - the child's
            self.nodes.append(subprocess.Popen(
                command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            ))  # fmt: skip

    def running(self) -> bool:
        return all(node.poll() is None for node in self.nodes)

    def finish(self, timeout_s: float) -> list[int]:
        """Every node's exit code; on a timeout every node is killed and ``TimeoutExpired`` raised."""
        deadline = time.monotonic() + timeout_s
        try:
            return [node.wait(timeout=max(1.0, deadline - time.monotonic())) for node in self.nodes]
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL every node's session, as an out-of-memory kill or a lost allocation would end the run."""
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):  # already gone
                os.killpg(node.pid, signal.SIGKILL)
        for node in self.nodes:
            node.wait()


def checkpoints(work: Path) -> list[Path]:
    """The complete checkpoints, oldest first (a sharded checkpoint's ``.metadata`` is written last)."""
    found = [p for p in (work / OUTPUTS / "checkpoints").glob("*.ckpt") if (p / ".metadata").exists()]
    return sorted(found, key=lambda p: int(p.name.split("step=")[1].split(".")[0]))


def logs(work: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(work.glob("*.log")))
