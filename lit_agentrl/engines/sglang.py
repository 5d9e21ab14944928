"""The in-process SGLang engine (``engine: sglang``): an ``sglang.Engine`` in the trainer's process, token in / token out.

SGLang itself is imported only when the engine is built. Written against SGLang 0.5.23, whose weight updates run
inside a session: ``begin_weight_update()``, any number of ``update_weights_from_tensor(...)``,
``end_weight_update()`` (:class:`~lit_agentrl.engines.sglang_base.SGLangBase`, shared with the HTTP engine). Each
request carries a request id and a sampling seed of ours (:mod:`~lit_agentrl.engines.sglang_requests`). SGLang servers
are :mod:`~lit_agentrl.engines.sglang_http`'s (``engine: sglang_http``), also importable from here.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from lit_agentrl.engines.base import GenerateResult, RolloutEngine
from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.engines.registry import register_engine
from lit_agentrl.engines.requests import StreamKeys
from lit_agentrl.engines.sglang_base import SGLangBase, as_pair, flattened_payloads, server_env
from lit_agentrl.engines.sglang_http import SGLangHTTPEngine
from lit_agentrl.engines.sglang_placement import placed_server_args, rank_nccl_port
from lit_agentrl.engines.sglang_requests import warn_unseeded
from lit_agentrl.models.dtypes import TORCH_DTYPES

__all__ = ["SGLangEngine", "SGLangHTTPEngine", "server_env"]


def _import_sglang() -> Any:
    try:
        import sglang
    except ImportError as exc:
        raise ImportError(
            "rollout engine 'sglang' needs SGLang: `pip install 'lit-agentrl[sglang]'` on a GPU machine, or "
            "`scripts/build_sglang_env.sh` for the CPU test environment"
        ) from exc
    return sglang


@register_engine("sglang")
class SGLangEngine(SGLangBase):
    """An in-process ``sglang.Engine`` with ``skip_tokenizer_init=True``.

    Args:
        model_path: local Hugging Face model directory.
        seed: SGLang's ``random_seed``.
        dtype: ``bfloat16``, ``float16`` or ``float32``.
        tp_size: tensor-parallel size of this engine.
        mem_fraction_static: fraction of GPU memory for weights and KV cache (None: SGLang's default).
        enable_memory_saver: required for ``release_memory_occupation`` (colocated training).
        attention_backend: e.g. ``fa3``, ``flashinfer``, ``triton``; ``torch_native`` on CPU.
        flattened_bucket: send each weight bucket as one flattened tensor (fewer IPC handles).
        **server_args: any other ``ServerArgs`` field, passed through (``device``, ``max_total_tokens``, ...).

    Built by a trainer (:meth:`build` with a placement), the engine runs on its rank's GPU: ``base_gpu_id``
    is the rank's local rank unless ``engine.kwargs`` set it (see :func:`placed_server_args`); its ``random_seed``
    is the run's seed + the global rank (ranks sample apart), and its ``nccl_port`` one of its own
    (:func:`rank_nccl_port`).

    ``loop`` is SGLang's own event loop: the rollout manager runs its agents on it, since SGLang's
    tokenizer manager serves every request and control call from one loop. ``busy_seconds`` is None (SGLang
    does not report its compute). ``context_length`` is SGLang's (its model config's, or ``context_length`` among
    ``engine.kwargs``). A call whose task is cancelled (a trajectory's timeout) has its requests aborted by SGLang
    itself (see :meth:`async_generate`). Each request's
    ``sampling_seed`` comes from its trajectory (see :meth:`reseed`); SGLang samples from it only with
    ``enable_deterministic_inference: true`` (GPU attention backends only), and the engine warns at start without it.
    """

    shared = False  # one engine per rank

    @classmethod
    def build(
        cls, model_path: str, seed: int = 0, placement: EnginePlacement | None = None, **kwargs: Any
    ) -> list[RolloutEngine]:
        """One engine, placed on this rank's GPUs by :func:`placed_server_args`; with ``tp_size`` > 1 and several
        ranks per node, a client of the server the rank's group shares (:mod:`lit_agentrl.engines.sglang_group`).
        """
        tp_size = int(kwargs.get("tp_size", 1))
        if placement is not None and placement.with_tp_size(tp_size).group_size > 1:
            return [SGLangHTTPEngine.for_group(model_path, seed, placement.with_tp_size(tp_size), kwargs)]
        kwargs.pop("group_port", None)
        if placement is None:
            return [cls(model_path, seed=seed, **kwargs)]
        server_args = placed_server_args(kwargs, placement)
        server_args.setdefault("nccl_port", rank_nccl_port(placement))
        return [cls(model_path, seed=seed + placement.global_rank, **server_args)]

    def __init__(
        self,
        model_path: str,
        seed: int = 0,
        dtype: str = "bfloat16",
        tp_size: int = 1,
        mem_fraction_static: float | None = None,
        enable_memory_saver: bool = False,
        attention_backend: str | None = None,
        flattened_bucket: bool = True,
        log_level: str = "warning",
        **server_args: Any,
    ) -> None:
        optional = {"mem_fraction_static": mem_fraction_static, "attention_backend": attention_backend}
        os.environ.update(server_env(model_path))  # the scheduler process reads it
        before = _child_pids()
        self._engine = self._launch(
            model_path=model_path,
            skip_tokenizer_init=True,
            random_seed=seed,
            dtype=dtype,
            tp_size=tp_size,
            enable_memory_saver=enable_memory_saver,
            log_level=log_level,
            **{k: v for k, v in optional.items() if v is not None},
            **server_args,
        )
        self._own_pids = _child_pids() - before  # SGLang's scheduler and detokenizer processes
        self.streams = StreamKeys(seed)
        warn_unseeded("in process", server_args)
        manager = getattr(self._engine, "tokenizer_manager", None)  # None: a test's stand-in
        self.context_length = getattr(manager, "context_len", None)
        self.loop = self._engine.loop
        self.tp_size = tp_size
        self.weight_dtype = TORCH_DTYPES.get(dtype)  # None for SGLang's "auto": the checkpoint's own
        self.flattened_bucket = flattened_bucket
        self._read_model(model_path)

    def _launch(self, **server_args: Any) -> Any:
        """Start SGLang's ``Engine`` from ``ServerArgs`` fields (tests override it to record them)."""
        return _import_sglang().Engine(**server_args)

    async def async_generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None = None,
        return_logprob: bool = False,
        **kwargs: Any,
    ) -> GenerateResult | list[GenerateResult]:
        call = self._call_args(input_ids, sampling_params, kwargs, self.context_length)
        with self._serving_adapter(call.kwargs):
            # Cancelled (a trajectory's timeout), SGLang aborts the call's requests itself: the cancellation reaches
            # TokenizerManager.generate_request, whose ``except BaseException`` aborts every request it dispatched
            # (``_release_req_states_on_failure``, SGLang 0.5.23); test_sglang_abort.py holds it to that.
            return await self._engine.async_generate(**call.kwargs, return_logprob=return_logprob)

    # ------------------------------------------------------------------ weights

    def _call(self, what: str) -> Any:
        return getattr(self._engine, what)()

    def _push(self, pairs: list[tuple[str, torch.Tensor]], load_format: str | None, flush_cache: bool) -> Any:
        if self.flattened_bucket and load_format is None and len(pairs) > 1:  # one tensor: sent as is, no copy
            return self._engine.update_weights_from_tensor(
                flattened_payloads(pairs, self.tp_size), load_format="flattened_bucket", flush_cache=flush_cache
            )
        return self._engine.update_weights_from_tensor(pairs, load_format=load_format, flush_cache=flush_cache)

    def update_weights_from_disk(self, model_path: str) -> tuple[bool, str]:
        return as_pair(self._engine.update_weights_from_disk(model_path))

    def _load_adapter(self, name: str, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Any:
        return self._engine.load_lora_adapter_from_tensors(name, tensors, config)  # GPU tensors travel by CUDA IPC

    def _unload_adapter(self, name: str) -> Any:
        return self._engine.unload_lora_adapter(name)

    def _server_info(self) -> dict[str, Any]:
        return dict(self._engine.get_server_info())

    def _where(self) -> str:
        return "in process"

    # ------------------------------------------------------------------ memory and lifecycle

    def flush_cache(self) -> bool:
        result = self._engine.flush_cache()
        return bool(getattr(result, "success", result))

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Free GPU memory (``weights``, ``kv_cache``, ``cuda_graph``) for a colocated trainer; engine idle."""
        self.flush_cache()
        self._engine.release_memory_occupation(tags=tags)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._engine.resume_memory_occupation(tags=tags)

    def shutdown(self) -> None:
        """Stop SGLang's own processes, and only those. SGLang 0.5.23's ``Engine.shutdown`` kills every child of the
        calling process (``kill_process_tree(os.getpid(), include_parent=False)``): in a trainer that is also the other
        ranks Lightning launched from rank 0, wandb's service, reward and sandbox workers. Its copy registered with
        ``atexit`` is dropped for the same reason."""
        with _kills_only(self._own_pids):
            self._engine.shutdown()
        atexit.unregister(self._engine.shutdown)


def _child_pids() -> set[int]:
    """The PIDs of this process's descendants (psutil comes with SGLang; without it, none are known)."""
    try:
        import psutil
    except ImportError:
        return set()
    return {child.pid for child in psutil.Process().children(recursive=True)}


@contextlib.contextmanager
def _kills_only(pids: set[int]) -> Iterator[None]:
    """Within the block, SGLang's engine module kills the process trees of ``pids`` where it would kill every child
    of this process."""
    try:
        from sglang.srt.entrypoints import engine as sglang_engine
    except ImportError:  # an engine whose launch a test replaced
        yield
        return
    kill_tree = sglang_engine.kill_process_tree

    def kill_own(parent_pid: int | None, include_parent: bool = True, **kwargs: Any) -> None:
        if parent_pid in (None, os.getpid()) and not include_parent:
            for pid in pids:
                kill_tree(pid, include_parent=True, **kwargs)
        else:
            kill_tree(parent_pid, include_parent=include_parent, **kwargs)

    sglang_engine.kill_process_tree = kill_own
    try:
        yield
    finally:
        sglang_engine.kill_process_tree = kill_tree
