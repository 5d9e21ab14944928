"""Run ONE rollout of one task of a `verifiers` (v1 API) environment and print its reward.

Standalone: it imports only the stdlib and `verifiers`, and runs under the verifiers venv's
python (built by `scripts/build_verifiers_env.sh`), by file path:

    echo '{"taskset": {"id": "textarena", "game": "Hangman-v0"}, "task_index": 0}' \
        | OPENAI_BASE_URL=http://host:port/v1 OPENAI_API_KEY=... VF_MODEL=my-model \
          "$(scripts/build_verifiers_env.sh)" lit_agentrl/agents/libraries/verifiers_episode.py

stdin: one JSON object.
    taskset     (required) the taskset's config, as vf-eval's `--env.taskset.*`: its `id` names
                an installed taskset package (`textarena`, `my_pkg`) the way vf-eval does, or a
                class as `pkg.module:Class` / `path/to/file.py:Class`; the other keys are its
                config fields (e.g. `game`, `task: {rewards: ...}`).
    task_index  which task of the taskset's `load()` stream (default 0).
    harness     the agent program, as `--env.agent.harness.*` (default: the taskset's bundled
                harness if it ships one, else `{"id": "null"}`, the plain chat loop).
    runtime     where the harness runs, as `--env.agent.runtime.*` (default
                `{"type": "subprocess"}`; verifiers' own default is a remote Prime sandbox).
    agent       other per-seat knobs (`max_turns`, `timeout`, ...), applied to every seat.
    env         env-level config, as `--env.*` (e.g. `{"id": "best-of-n"}`, a `module:Class`
                Env, `timeout`, or per-seat overrides keyed by the seat's name).
    model       model name sent upstream (default: $VF_MODEL, else $OPENAI_MODEL).
    sampling    sampling knobs (`max_tokens`, `temperature`, `top_p`, extra keys pass through).

Every model call goes to $OPENAI_BASE_URL (chat completions), keyed by $OPENAI_API_KEY.
Last stdout line: {"reward": float, "metrics": {name: float}}. Everything else goes to stderr.
Any failure (an errored rollout, a rollout no reward function scored): non-zero exit and a message on stderr.
SIGTERM cancels the rollout, so verifiers stops the harness it started (in a process group of its own).

With `"list": N` instead of `task_index`, nothing runs: the last stdout line is
{"tasks": [{"index": i, "prompt": [messages]}, ...]}, the first N tasks' opening messages (system prompt included),
which data/prepare_verifiers.py writes as rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import itertools
import json
import logging
import os
import signal
import sys
import types
from pathlib import Path
from typing import Any

# Run by file path, Python puts this file's directory first on sys.path, and that directory
# holds lit_agentrl's own textarena.py / openenv.py / ..., which would shadow the real packages.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import verifiers.v1 as vf  # noqa: E402
from verifiers.v1.env import RunSlot  # noqa: E402
from verifiers.v1.utils.loaders import default_harness_id, env_config_type  # noqa: E402

logger = logging.getLogger("verifiers_episode")


# --- plugin ids: verifiers resolves an id by importing a module exporting one class -------


def _plugin_id(spec: str, base: type) -> str:
    """An id verifiers' loader can import. A plain id passes through (vf-eval semantics);
    `module:Class` or `file.py:Class` becomes a synthetic module exporting just that class
    (the loader imports the id as a module and takes the one `base` subclass in `__all__`)."""
    if ":" not in spec:
        return spec
    module_path, _, attr = spec.rpartition(":")
    if module_path.endswith(".py"):
        path = Path(module_path).resolve()
        file_spec = importlib.util.spec_from_file_location(path.stem, path)
        if file_spec is None or file_spec.loader is None:
            raise ImportError(f"cannot import {module_path!r}")
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[path.stem] = module  # pydantic/pickling need the module registered
        file_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_path)
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{spec!r} is not a {base.__name__} subclass (got {cls!r})")
    # Lowercase, no '-' or '/': the loader normalizes ids that way before importing.
    name = f"vf_episode_{base.__name__.lower()}_{attr.lower()}"
    shim = types.ModuleType(name)
    shim.__all__ = [attr]  # type: ignore[attr-defined]
    setattr(shim, attr, cls)
    sys.modules[name] = shim
    return name


def _env_config(req: dict[str, Any]) -> vf.EnvConfig:
    """The run's `[env]` block from the request, every seat on the requested harness/runtime."""
    env: dict[str, Any] = dict(req.get("env") or {})
    taskset = dict(req.get("taskset") or {})
    if not taskset.get("id"):
        raise ValueError("request needs taskset.id")
    taskset["id"] = _plugin_id(str(taskset["id"]), vf.Taskset)
    env["taskset"] = taskset
    if env.get("id"):
        env["id"] = _plugin_id(str(env["id"]), vf.Env)
    seat: dict[str, Any] = {
        "runtime": req.get("runtime") or {"type": "subprocess"},
        **(req.get("agent") or {}),
    }
    if req.get("harness"):
        seat["harness"] = req["harness"]
    elif default_harness_id(taskset["id"]) == "bash":
        # No bundled harness: verifiers would pick `bash` (a tool-calling coding agent);
        # a plain chat loop is the neutral default for a policy rollout.
        seat["harness"] = {"id": "null"}
    cls = env_config_type(taskset["id"], env.get("id") or "")
    seats = [n for n, f in cls.model_fields.items() if isinstance(f.default, vf.AgentConfig)]
    for name in seats:
        env[name] = {**seat, **(env.get(name) or {})}
    return vf.resolve_env_config(env)


def _floats(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}


async def run_one(req: dict[str, Any]) -> dict[str, Any]:
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        raise ValueError("OPENAI_BASE_URL is not set")
    model = req.get("model") or os.environ.get("VF_MODEL") or os.environ.get("OPENAI_MODEL")
    if not model:
        raise ValueError("no model name: set `model` in the request, or $VF_MODEL / $OPENAI_MODEL")
    index = int(req.get("task_index", 0))
    env = vf.load_environment(_env_config(req))
    # islice, not list(): some tasksets (textarena) are infinite generators.
    task = next(itertools.islice(iter(env.taskset), index, None), None)
    if task is None:
        raise IndexError(f"taskset has no task at index {index}")
    ctx = vf.ModelContext(
        model=model,
        client=vf.EvalClientConfig(base_url=base_url, api_key_var="OPENAI_API_KEY"),
        sampling=vf.SamplingConfig.model_validate(req.get("sampling") or {}),
    )
    # What vf-eval's runner does per slot: serving resources up once, then one episode.
    async with env.serving():
        episode = await env.run_slot(RunSlot(task), ctx)
    if not episode.ok:
        errors = [e for t in episode.traces for e in t.errors] + list(episode.errors)
        detail = "\n".join(f"{e.type}: {e.message}\n{e.traceback or ''}" for e in errors)
        raise RuntimeError(f"rollout failed:\n{detail or '(no error recorded)'}")
    scored = [t for t in episode.traces if t.rewards]
    if not scored:
        raise RuntimeError("no reward function of the taskset scored the rollout (a taskset without @vf.reward?)")
    metrics: dict[str, float] = {}
    for trace in episode.traces:
        # Seat-prefixed only when an env played several seats.
        prefix = f"{trace.agent.name}/" if len(episode.traces) > 1 and trace.agent.name else ""
        rewards = {k: r.score for k, r in trace.rewards.items() if r is not None}
        for k, v in {**_floats(trace.metrics), **_floats(rewards)}.items():
            metrics[prefix + k] = v
    # The episode's score as verifiers' GEPA adapter reads it: mean over scored traces.
    reward = sum(t.reward for t in scored) / len(scored)
    return {"reward": float(reward), "metrics": metrics}


def list_tasks(req: dict[str, Any]) -> dict[str, Any]:
    """The opening messages of the taskset's first ``req["list"]`` tasks."""
    env = vf.load_environment(_env_config(req))
    tasks = []
    for task in itertools.islice(iter(env.taskset), int(req["list"])):
        data = task.data
        prompt = (
            [{"role": "user", "content": data.prompt}]
            if isinstance(data.prompt, str)
            else [
                message if isinstance(message, dict) else message.model_dump(exclude_none=True)
                for message in data.prompt or []
            ]
        )
        if data.system_prompt:
            prompt.insert(0, {"role": "system", "content": data.system_prompt})
        tasks.append({"index": data.idx, "prompt": prompt})
    return {"tasks": tasks}


async def _cancelled_by_sigterm(work: Any) -> Any:
    """Await the coroutine ``work``, cancelling it on SIGTERM (verifiers' cleanup then runs)."""
    task = asyncio.ensure_future(work)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await task


def _no_downloads() -> None:
    """TextArena calls ``nltk.download`` for its word lists whenever it is imported: a network fetch per rollout.
    The build script puts the corpora in the venv once; here a download is a no-op, so a missing corpus is nltk's
    own LookupError (at setup, when the taskset is loaded) rather than a fetch."""
    with contextlib.suppress(ImportError):
        import nltk

        nltk.download = lambda *args, **kwargs: True


def main() -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("VF_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The harness runs as a uv script; the build script installs uv next to this python.
    bindir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    _no_downloads()
    stdout = sys.stdout
    try:
        req = json.loads(sys.stdin.read())
        if not isinstance(req, dict):
            raise ValueError("stdin must hold one JSON object")
        # Keep stdout for the result line only (e.g. nltk prints download errors there).
        with contextlib.redirect_stdout(sys.stderr):
            result = list_tasks(req) if "list" in req else asyncio.run(_cancelled_by_sigterm(run_one(req)))
    except Exception as e:  # one clear message for any failure
        logger.debug("failure", exc_info=True)
        print(f"verifiers_episode: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), file=stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
