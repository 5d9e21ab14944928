"""Configuration keys that changed, each refused with what replaces it, before LightningCLI parses the config (whose
own error would say only that the key is unknown).

A key is named as a user writes it: ``model.<key>``, ``data.<key>``, or ``<Callback>.<key>`` for a callback's
``init_args`` under ``trainer.callbacks``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from lit_agentrl.errors import UserInputError

_MOVED = {
    "optimizer": ("lr", "weight_decay", "betas", "warmup_steps", "lr_schedule", "grad_clip", "mini_batches"),
    "loss": (
        "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "kl_coef", "entropy_coef", "policy_ratio", "advantage_std",
        "old_logprobs",
    ),
    "compute": (
        "micro_batch_tokens", "sequence_packing", "logprob_chunk_tokens", "gradient_checkpointing", "param_dtype",
    ),
}  # fmt: skip
"""The flat ``model.*`` keys that became a group's, under the same name."""

RENAMED: dict[str, str] = {
    **{f"model.{key}": f"model.{group}.{key}" for group, keys in _MOVED.items() for key in keys},
    "model.loss_aggregation": "model.loss.aggregation",
    "model.loss_norm_length": "model.loss.norm_length",
    "model.normalize_advantage_std": "model.loss.advantage_std: sample, population (both divide by the group's "
    "std) or none (Dr. GRPO: centred only)",
    "model.rollout_temperature": "RolloutCallback.train.sampling_params.temperature alone: log-probs are computed at the "
    "temperature each rollout was sampled at",
    "model.rollout_correction": "model.correction: {kind: tis} (or mis; null: off)",
    "model.rollout_correction_level": "model.correction.level",
    "model.rollout_is_threshold": "model.correction.threshold",
    "model.rollout_is_threshold_low": "model.correction.threshold_low",
    "model.rollout_mis_weight": "model.correction.mis_weight",
    "model.truncated": "model.overlong.mode",
    "model.overlong_max_length": "model.overlong.max_length",
    "model.overlong_buffer": "model.overlong.buffer",
    "model.overlong_penalty_factor": "model.overlong.penalty_factor",
    "model.val_pass_k": "RolloutCallback.validation: {pass_k: [...]}",
    "data.reward_fn": "RolloutCallback.reward: NAME (or {fn: NAME})",
    "data.dynamic_sampling": "RolloutCallback.train: {dynamic_sampling: {max_rounds: N}} ({} for the defaults; null: off)",
    "data.dynamic_max_rounds": "RolloutCallback.train.dynamic_sampling.max_rounds",
    "RolloutCallback.n_samples": "RolloutCallback.train: {n_samples: N}",
    "RolloutCallback.sampling_params": "RolloutCallback.train: {sampling_params: {...}}",
    "RolloutCallback.val_n_samples": "RolloutCallback.validation: {n_samples: N}",
    "RolloutCallback.val_sampling_params": "RolloutCallback.validation: {sampling_params: {...}}",
    "RolloutCallback.trajectory_timeout_s": "RolloutCallback.health: {trajectory_timeout_s: S}",
    "RolloutCallback.max_failed_fraction": "RolloutCallback.health: {max_failed_fraction: F}",
    "RolloutCallback.flat_reward_warn_steps": "RolloutCallback.health: {flat_reward_warn_steps: N}",
    "RolloutCallback.check_template_drift": "RolloutCallback.health: {template_drift: true|false}",
    "RolloutCallback.engine_kwargs": "RolloutCallback.engine: {name: ..., kwargs: {...}}",
    "RolloutCallback.engine_modules": "RolloutCallback.engine: {name: ..., modules: [...]}",
    "RolloutCallback.max_inflight_per_engine": "RolloutCallback.engine: {name: ..., max_inflight: N}",
    "RolloutCallback.sync_bucket_mb": "RolloutCallback.engine: {name: ..., sync_bucket_mb: N}",
    "RolloutCallback.colocate": "RolloutCallback.engine: {name: ..., colocate: true}",
    "RolloutCallback.offload_trainer": "RolloutCallback.engine: {name: ..., offload_trainer: ...}",
    "RolloutCallback.mode": "RolloutCallback.async_rollouts: null (sync) or {ahead: 1} (what mode: async did)",
    "RolloutCallback.max_staleness": "RolloutCallback.async_rollouts: {ahead: N} (how far ahead rollouts run; the "
    "staleness follows from it, and async_rollouts.max_staleness may only raise the drop threshold)",
    "RolloutCallback.partial_rollouts": "RolloutCallback.async_rollouts: {partial: true}",
    "RolloutCallback.ready_fraction": "RolloutCallback.async_rollouts: {ready_fraction: F} (with partial: true)",
}
"""Old key -> what to write instead."""


def refuse_renamed_keys(argv: Sequence[str]) -> None:
    """Raise :class:`UserInputError` for the first renamed key in the config files or ``--key`` options of ``argv``."""
    for source, key in _keys(argv):
        if key in RENAMED:
            raise UserInputError(f"{source}: {key} has been replaced", hint=f"use {RENAMED[key]}")


_CALLBACK_OPTION = re.compile(r"^--trainer\.callbacks\.([A-Z]\w*)\.(?:init_args\.)?(\w+)")


def _keys(argv: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(where, key) of every key the command line sets, directly or through ``--config`` files."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            yield from _config_keys(args[i + 1])
        elif arg.startswith("--config="):
            yield from _config_keys(arg.split("=", 1)[1])
        elif arg.startswith(("--model.", "--data.")):
            key = arg[2:].split("=", 1)[0]
            yield f"the option --{key}", key
        elif match := _CALLBACK_OPTION.match(arg.split("=", 1)[0]):  # --trainer.callbacks.<Class>.[init_args.]<key>
            yield f"the option {match.group(0)}", f"{match.group(1)}.{match.group(2)}"


def _config_keys(path: str) -> Iterator[tuple[str, str]]:
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return  # LightningCLI reports an unreadable config itself
    if not isinstance(config, dict):
        return
    for section in ("model", "data"):
        for key in _mapping(config.get(section)):
            yield path, f"{section}.{key}"
    for callback in _mapping(config.get("trainer")).get("callbacks") or []:
        if isinstance(callback, dict):
            name = str(callback.get("class_path", "")).rsplit(".", 1)[-1]
            for key in _mapping(callback.get("init_args")):
                yield path, f"{name}.{key}"


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
