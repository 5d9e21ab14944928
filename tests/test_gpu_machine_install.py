"""The GPU check as the GPU machine runs it: its own packages only (scripts/gpu_machine.txt, in a venv built by
scripts/build_gpu_machine_env.sh), the project's other dependencies installed offline from the wheelhouse
(scripts/gpu_wheelhouse.py) without touching torch, then the check's CPU smoke run on that environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

pytestmark = [pytest.mark.gpu_machine, pytest.mark.slow, pytest.mark.timeout(1500)]
MACHINE_PY_ENV = "LIT_AGENTRL_GPU_MACHINE_PY"


def machine_python() -> Path:
    """The venv's python (``LIT_AGENTRL_GPU_MACHINE_PY``); skipped without it, except in CI where it must be there."""
    python = os.environ.get(MACHINE_PY_ENV)
    if not python:
        if os.environ.get("LIT_AGENTRL_REQUIRE_GPU_MACHINE") == "1":
            pytest.fail(f"{MACHINE_PY_ENV} is not set (PY=$(scripts/build_gpu_machine_env.sh))")
        pytest.skip(f"{MACHINE_PY_ENV} is not set; .ci/run builds the venv (scripts/build_gpu_machine_env.sh)")
    return Path(python)


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)


def test_the_wheelhouse_installs_offline_beside_the_machines_torch_and_the_smoke_check_passes(tmp_path: Path):
    base = machine_python()
    venv = tmp_path / "machine"
    shutil.copytree(base.parents[1], venv, symlinks=True)  # a fresh copy: the cached venv stays as the machine is
    python = venv / "bin" / "python"
    version = run([str(python), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"]).stdout
    before = run([str(python), "-c", "import torch; print(torch.__version__)"]).stdout
    assert run([str(python), "-c", "import langgraph"]).returncode != 0  # the machine lacks it

    wheelhouse = tmp_path / "wheelhouse"
    built = run([sys.executable, "scripts/gpu_wheelhouse.py", "--out", str(wheelhouse), "--python-version",
                 version.strip(), "--machine", str(python)], cwd=REPO_ROOT)  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "MiB  in all" in built.stdout

    # gpu_checks.sh's install step, as on the machine (its table then stops: no CUDA GPU here)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "GPU_WHEELHOUSE": str(wheelhouse)}
    env.pop("PYTHONPATH", None)
    checks = run(["bash", "scripts/gpu_checks.sh", "--part", "1"], cwd=REPO_ROOT, env=env)
    assert "no CUDA GPU visible" in checks.stdout + checks.stderr, checks.stdout[-3000:] + checks.stderr[-3000:]
    assert run([str(python), "-c", "import torch; print(torch.__version__)"]).stdout == before  # torch untouched

    out = tmp_path / "table.json"
    smoke = run([str(python), str(REPO_ROOT / "scripts" / "gpu_checks.py"), "--smoke", "--out", str(out)], cwd=tmp_path,
                env={**env, "PYTHONPATH": str(REPO_ROOT), "WANDB_MODE": "offline"})  # fmt: skip
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok"] * 4, rows
