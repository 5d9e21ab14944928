"""``verifiers``: Prime Intellect's verifiers environments (``verifiers`` 0.4.0, its ``v1`` API), rolled out by
verifiers itself against the trajectory's gateway and scored by the taskset's own reward functions.

verifiers pins ``openai<3`` and runs each rollout's agent program (its harness) as a uv script, so it lives in a venv
of its own, built by ``scripts/build_verifiers_env.sh`` (which also fetches the harness's dependencies once, so that
rollouts need no network). For each trajectory, that venv's python runs :mod:`.verifiers_episode` (a script importing
only verifiers): it loads the row's taskset, takes its task ``task_index`` and runs one rollout the way ``vf-eval``
does, every model call (one streamed chat completion per model turn, the whole conversation each time) sent to the
trajectory's gateway, which records the tokens the engine sampled. The rollout's reward (the taskset's weighted
``@vf.reward`` functions) is the trajectory's; their unweighted scores and ``@vf.metric`` values are logged as
``agent/verifiers/<name>``.

Rows (``data/prepare_verifiers.py`` writes them, with each task's opening messages as the row's prompt)::

    {"agent_name": "verifiers", "prompt": [...], "taskset": {"id": "textarena", "game": "Hangman-v0"}, "task_index": 3}

``taskset.id`` names a taskset as ``vf-eval --env.taskset.id`` does (an installed taskset package: ``textarena``,
``openenv``, ``nemo_gym``, ``harbor``), or a class as ``module:Class`` / ``path/file.py:Class``; its other keys are the
taskset's config. The agent YAML may set ``harness`` (default: the taskset's own, else ``null``, the plain chat
loop), ``runtime`` (default ``{type: subprocess}``; verifiers' own default is a remote Prime sandbox), ``agent``
(``max_turns``, ``timeout``) and ``env``, each as ``vf-eval``'s ``--env.*`` options. The venv's python is
``$LIT_AGENTRL_VERIFIERS_PYTHON``, else that of ``$LIT_AGENTRL_VERIFIERS_VENV`` (default
``~/.cache/lit-agentrl/verifiers-venv``). A trajectory that times out is sent SIGTERM (verifiers then stops its
harness), then killed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import OmegaConf

from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.openai_client import AgentResult, OpenAIClientAgent
from lit_agentrl.agents.openai_command import command_result, run_program, stderr_tail
from lit_agentrl.agents.registry import register

__all__ = ["VerifiersAgent", "episode_command", "verifiers_python"]

AGENT = "verifiers"
EPISODE_SCRIPT = Path(__file__).with_name("verifiers_episode.py")
PASSED_KEYS = ("harness", "runtime", "agent", "env")
"""Agent YAML keys passed to the episode as they are (``vf-eval``'s ``--env.agent.harness``, ... options)."""
MODEL_NAME = "policy"
"""The model name verifiers sends (the gateway serves the policy whatever the name)."""
TERMINATE_GRACE_S = 10.0
"""How long a cancelled episode has to stop its harness before it is killed."""
CHECK_TIMEOUT_S = 300.0
"""The longest a taskset's setup check (loading it in the venv) may take."""
BUILD = "scripts/build_verifiers_env.sh"


def verifiers_python() -> Path:
    """The python of the venv holding verifiers (see the module's docstring)."""
    if explicit := os.environ.get("LIT_AGENTRL_VERIFIERS_PYTHON"):
        return Path(explicit)
    venv = os.environ.get("LIT_AGENTRL_VERIFIERS_VENV", str(Path.home() / ".cache/lit-agentrl/verifiers-venv"))
    return Path(venv) / "bin" / "python"


def episode_command() -> list[str]:
    return [str(verifiers_python()), str(EPISODE_SCRIPT)]


class VerifiersAgent(OpenAIClientAgent):
    """The ``verifiers`` agent (see the module's docstring)."""

    required_fields: ClassVar[tuple[str, ...]] = ("taskset", "task_index")
    scores_itself: ClassVar[bool] = True

    @staticmethod
    async def function(client: Any, row: dict[str, Any], cfg: Any) -> AgentResult:  # type: ignore[override]
        request = {"taskset": row["taskset"], "task_index": row["task_index"], "model": MODEL_NAME}
        request |= {key: value for key in PASSED_KEYS if (value := _plain(cfg_get(cfg, key, None))) is not None}
        env = {**os.environ, "OPENAI_BASE_URL": str(client.base_url), "OPENAI_API_KEY": str(client.api_key)}
        status, out, err = await run_program(
            episode_command(), json.dumps(request).encode(), env, terminate_grace_s=TERMINATE_GRACE_S
        )
        where = f"verifiers taskset {row['taskset'].get('id')!r} task {row['task_index']}"
        if status != 0:
            raise RuntimeError(f"{where}: its rollout failed (exit {status}): {stderr_tail(err)}")
        result = command_result(out.decode(errors="replace"), AGENT)
        if result is None or result.reward is None:
            raise RuntimeError(f"{where}: the episode printed no reward: {stderr_tail(err)}")
        return result

    @classmethod
    def row_errors(cls, row: Mapping[str, Any]) -> list[str]:
        taskset, index = row.get("taskset"), row.get("task_index")
        if not isinstance(taskset, Mapping) or not isinstance(taskset.get("id"), str):
            return [f"field 'taskset' must be a mapping with a string 'id' (e.g. {{id: textarena}}), got {taskset!r}"]
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            return [f"field 'task_index' must be a task's position in the taskset (an integer >= 0), got {index!r}"]
        problem = _taskset_problem(json.dumps(taskset, sort_keys=True))
        return [problem] if problem else []


register(AGENT)(VerifiersAgent)


@cache
def _taskset_problem(taskset_json: str) -> str | None:
    """Why the taskset cannot be rolled out here (the venv is missing, or verifiers cannot load it), or None; each
    taskset is loaded once per process, in the venv, listing its first task."""
    python = verifiers_python()
    if not python.exists():
        return (
            f"agent {AGENT!r} runs verifiers in a venv of its own, not found at {python}: build it with {BUILD} "
            "(or name its python in LIT_AGENTRL_VERIFIERS_PYTHON)"
        )
    request = json.dumps({"taskset": json.loads(taskset_json), "list": 1})
    try:
        done = subprocess.run(
            episode_command(), input=request.encode(), capture_output=True, timeout=CHECK_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"verifiers could not load the taskset {taskset_json} within {CHECK_TIMEOUT_S:.0f} s"
    if done.returncode != 0:
        return f"verifiers could not load the taskset {taskset_json}: {stderr_tail(done.stderr)}"
    if not json.loads(done.stdout.decode().strip().splitlines()[-1])["tasks"]:
        return f"the verifiers taskset {taskset_json} has no task"
    return None


def _plain(value: Any) -> Any:
    """An agent YAML value (an OmegaConf node or a plain value) as plain JSON-able data."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
