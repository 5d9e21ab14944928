"""Shared fixtures: a tiny Qwen3 and tokenizer built locally once per session, and engines over it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

import tempfile

from hypothesis.configuration import set_hypothesis_home_dir

from lit_agentrl.models.tiny import save_tiny_model

# Hypothesis keeps its examples and caches in ./.hypothesis: keep the checkout clean of what tests write.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "lit-agentrl-hypothesis")

REPO_ROOT = Path(__file__).resolve().parents[1]


SGLANG_TEST_TIMEOUT_S = 1800
"""An SGLang test's limit: a server starts in 11-18 s on a quiet 2-core CPU, and several times that on a loaded one
(pytest's default of 300 s, pyproject.toml, failed one under load); a hang still fails."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("sglang") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SGLANG_TEST_TIMEOUT_S))


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What decides this run's bits and skips, at the top of every run: the thread count, and the optional parts
    (their tests skip without them, saying why; CI provides each and requires it)."""
    import importlib.util
    import shutil

    import torch

    from lit_agentrl.agents.libraries.verifiers import verifiers_python

    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    missing = [
        name
        for name, present in [
            ("SGLang (its tests run in scripts/build_sglang_env.sh's venv)", importlib.util.find_spec("sglang")),
            ("Chromium (the viewer's browser test)", shutil.which("chromium") or shutil.which("chromium-browser")),
            ("a CUDA GPU (scripts/gpu_checks.sh)", torch.cuda.is_available()),
            ("bubblewrap (the code sandbox's boundary: apt-get install -y bubblewrap)", shutil.which("bwrap")),
            ("OpenEnv (its adapter's tests: pip install -e '.[openenv]')", importlib.util.find_spec("openenv")),
            ("verifiers (its adapter's tests: scripts/build_verifiers_env.sh)", verifiers_python().exists()),
        ]
        if not present
    ]
    lines = [f"lit-agentrl: torch {torch.get_num_threads()} threads (OMP_NUM_THREADS={threads})"]
    if missing:
        lines.append(f"lit-agentrl: not here, so their tests skip: {'; '.join(missing)}")
    return lines


REQUIRE_SANDBOX = os.environ.get("LIT_AGENTRL_REQUIRE_SANDBOX") == "1"
"""Set by .ci/run: there a sandbox test fails, not skips, when the machine lacks part of the boundary."""


@pytest.fixture(scope="session")
def sandbox_boundary() -> None:
    """For tests that run code in a default ``PythonSandbox``: skip where this machine cannot build its whole
    boundary (bubblewrap, user namespaces, seccomp, cgroups), saying what is missing; fail instead in CI."""
    from lit_agentrl.tools.sandbox import PythonSandbox, SandboxUnavailable

    try:
        PythonSandbox()
    except SandboxUnavailable as exc:
        if REQUIRE_SANDBOX:
            pytest.fail(f"LIT_AGENTRL_REQUIRE_SANDBOX=1 but {exc}")
        pytest.skip(str(exc))


@pytest.fixture(autouse=True)
def _no_wandb_run_left_open():
    """A wandb run a test leaves open would be reused by the next WandbLogger in this process (wandb attaches to
    ``wandb.run``): finish it after every test."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def policy_model(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture()
def engine(tiny_model_dir: Path):
    from lit_agentrl.engines.hf import TransformersEngine

    eng = TransformersEngine(str(tiny_model_dir), seed=0)
    yield eng
    eng.shutdown()


@pytest.fixture()
def scripted_engine_factory(policy_model, tokenizer):
    from support import ScriptedEngine

    return lambda replies: ScriptedEngine(policy_model, tokenizer, replies)


@pytest.fixture(scope="session")
def quickstart_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lit_agentrl.models.tiny import TinyModelConfig

    return save_tiny_model(tmp_path_factory.mktemp("quickstart-model"), TinyModelConfig(tokenizer="words"))
