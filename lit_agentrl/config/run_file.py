"""A run's config file built in code, in the shape ``lit-agentrl fit --config`` reads: the small CPU run that tests,
benchmarks and the GPU check start from, the rollout callback's arguments within it, and dotted overrides of a
shipped config (``rollout.*`` naming the callback's ``init_args``, as a sweep script would write them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROLLOUT_CALLBACK = "lit_agentrl.callbacks.RolloutCallback"


def cpu_run(
    model_path: str | Path,
    work_dir: Path,
    *,
    max_steps: int,
    rollout: Mapping[str, Any],
    data: Mapping[str, Any],
    model: Mapping[str, Any] | None = None,
    seed: int = 7,
    callbacks: Sequence[Mapping[str, Any]] = (),
    **trainer: Any,
) -> dict[str, Any]:
    """One CPU process training ``max_steps`` steps, logging every step to a CSV under ``work_dir/logs``, with no
    checkpoints, progress bar or sanity validation; ``trainer`` keys override those."""
    return {
        "seed_everything": seed,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": max_steps,
            "log_every_n_steps": 1,
            "num_sanity_val_steps": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "enable_checkpointing": False,
            "default_root_dir": str(work_dir),
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(work_dir / "logs"), "name": "csv"},
            },
            "callbacks": [{"class_path": ROLLOUT_CALLBACK, "init_args": dict(rollout)}, *map(dict, callbacks)],
            **trainer,
        },
        "model": {"model_path": str(model_path), **(model or {})},
        "data": dict(data),
    }


def rollout_args(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``init_args`` of the config's rollout callback (the dict itself, to change in place)."""
    for callback in config.get("trainer", {}).get("callbacks") or []:
        if _class_name(callback) == "RolloutCallback":
            return callback.setdefault("init_args", {})
    raise KeyError("the config has no RolloutCallback under trainer.callbacks")


def set_keys(config: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with each dotted key set, missing parents made: ``seed_everything``, ``trainer.max_steps``,
    ``rollout.engine.name`` (the rollout callback's ``init_args``), and in a list of ``class_path`` entries the one of
    that class by name: ``trainer.callbacks.ModelCheckpoint.init_args.dirpath``."""
    for dotted, value in overrides.items():
        *parents, key = dotted.split(".")
        node: Any = config
        if parents and parents[0] == "rollout":
            node, parents = rollout_args(config), parents[1:]
        for parent in parents:
            node = _entry(node, parent, dotted) if isinstance(node, list) else node.setdefault(parent, {})
        node[key] = value
    return config


def _entry(entries: list[Any], name: str, dotted: str) -> dict[str, Any]:
    """The entry of ``entries`` whose ``class_path`` ends with ``name``."""
    for entry in entries:
        if isinstance(entry, dict) and _class_name(entry) == name:
            return entry
    names = [_class_name(e) for e in entries if isinstance(e, dict)]
    raise KeyError(f"{dotted}: no {name} in the list, which holds {names}")


def _class_name(entry: Mapping[str, Any]) -> str:
    """The class an entry of ``class_path`` and ``init_args`` builds, without its module."""
    return str(entry.get("class_path", "")).rsplit(".", 1)[-1]


def write_config(config: Mapping[str, Any], path: Path) -> Path:
    """The config as YAML at ``path``, for ``lit-agentrl fit --config path``."""
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path
