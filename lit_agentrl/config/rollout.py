"""The rollout side's settings as typed groups (``RolloutCallback``'s ``init_args``), checked when built.

``engine`` is the one group of the callback's own (``async_rollouts`` is :class:`~lit_agentrl.rollout.schedule.
AsyncRollouts`, the sampling parameters SGLang's dict)::

    - class_path: RolloutCallback
      init_args:
        engine: {name: sglang, kwargs: {dtype: bfloat16, mem_fraction_static: 0.85}, colocate: true}
        n_samples: 32
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lit_agentrl.errors import UserInputError


@dataclass(frozen=True)
class EngineSettings:
    """The rollout engines of each rank, and how they share the GPU with the trainer (``RolloutCallback.engine``; a
    name alone, ``engine: sglang``, is the same as ``engine: {name: sglang}``).

    Args:
        name: a registered engine: ``transformers`` or ``sglang`` (one engine per rank), ``transformers_process`` (the
            transformers engine in a process of its own), ``sglang_http`` (running SGLang servers shared by all
            ranks; rank 0 pushes the weights), or your own (``@register_engine("name")``).
        kwargs: the engine's constructor arguments (e.g. ``max_running_requests``, ``dtype``, ``mem_fraction_static``;
            ``urls`` for ``sglang_http``).
        modules: modules (dotted names or ``.py`` paths) imported at setup, before the engines are built, so the
            ``@register_engine`` of users' engines runs.
        max_inflight: most trajectories in flight against one engine.
        sync_bucket_mb: the size of one weight-push bucket.
        colocate: the engine shares the trainer's GPU: its memory (weights and KV cache) is released outside rollouts
            and resumed around the weight push (needs SGLang's ``enable_memory_saver``); the push then runs before
            each rollout, not after each step (:mod:`lit_agentrl.rollout.colocation`).
        offload_trainer: in colocated mode, move the trainer's parameters and optimizer state (and the reference's)
            to host memory while the engine generates (default: on with ``colocate``; needs ``colocate``).
    """

    name: str = "transformers"
    kwargs: dict[str, Any] = field(default_factory=dict)
    modules: list[str] = field(default_factory=list)
    max_inflight: int = 256
    sync_bucket_mb: int = 512
    colocate: bool = False
    offload_trainer: bool | None = None

    def __post_init__(self) -> None:
        where = "RolloutCallback.engine"
        if not self.name:
            raise UserInputError(f"{where}.name must name a registered engine, got {self.name!r}")
        if self.max_inflight < 1:
            raise UserInputError(f"{where}.max_inflight must be >= 1, got {self.max_inflight}")
        if self.sync_bucket_mb < 1:
            raise UserInputError(f"{where}.sync_bucket_mb must be >= 1, got {self.sync_bucket_mb}")
        if self.offload_trainer and not self.colocate:
            raise UserInputError(
                f"{where}.offload_trainer needs colocate: true (the trainer's states leave the GPU only to make room "
                "for an engine on the same GPU)"
            )

    @property
    def offloads(self) -> bool:
        """Whether the trainer's states go to host memory while the engine generates (``offload_trainer``, whose
        default follows ``colocate``)."""
        return self.colocate if self.offload_trainer is None else self.offload_trainer
