"""SGLang rollout engines: an in-process ``sglang.Engine`` (token in / token out), and SGLang HTTP servers.

Both are :class:`~lit_agentrl.engines.base.RolloutEngine` subclasses, registered as ``sglang`` and
``sglang_http``; SGLang itself is imported only when an in-process engine is built. Written against SGLang
0.5.23, whose weight updates run inside a session: ``begin_weight_update()``, any number of
``update_weights_from_tensor(...)``, ``end_weight_update()``. Each request carries a request id and a sampling seed
of ours (:mod:`~lit_agentrl.engines.sglang_requests`): a call that is cancelled or fails aborts its requests in SGLang.
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import base64
import contextlib
import logging
import os
import pickle
import socket
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from lit_agentrl.context import current_tag
from lit_agentrl.engines import sglang_group
from lit_agentrl.engines.base import GenerateResult, RolloutEngine, check_named_tensors, expected_weight_shapes
from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.engines.registry import register_engine
from lit_agentrl.engines.requests import StreamKeys
from lit_agentrl.engines.sglang_requests import SGLangCall, sglang_call, warn_unseeded
from lit_agentrl.engines.weight_names import checkpoint_names
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.dtypes import TORCH_DTYPES
from lit_agentrl.models.processors import is_vision_language, model_config

if TYPE_CHECKING:
    from lit_agentrl.config.training import Lora

log = logging.getLogger(__name__)

ADAPTER_NAME = "lit-agentrl-policy"
"""The policy's adapters are served as ``<ADAPTER_NAME>-<n>``, the n-th loaded (SGLang loads each name once)."""


def _adapter_name(loads: int) -> str:
    return f"{ADAPTER_NAME}-{loads}"


def _import_sglang() -> Any:
    try:
        import sglang
    except ImportError as exc:
        raise ImportError(
            "rollout engine 'sglang' needs SGLang: `pip install 'lit-agentrl[sglang]'` on a GPU machine, or "
            "`scripts/build_sglang_env.sh` for the CPU test environment"
        ) from exc
    return sglang


class _SGLangBase(RolloutEngine):
    """What both SGLang engines share: SGLang 0.5.23's weight-update session around checked pushes, LoRA adapters
    loaded from tensors and named in every request (subclasses provide the transport), and each request's id and
    sampling seed (:mod:`~lit_agentrl.engines.sglang_requests`).
    """

    streams: StreamKeys

    _shapes: dict[str, tuple[int, ...]]
    _model_type: str | None = None
    _image_token_id: int | None = None
    _in_session = False
    release_drops_weights = True  # SGLang frees them, and resumes with whatever the memory then holds
    serves_lora_adapters = True
    _adapter_loads = 0
    _retired_adapters: list[str]
    _adapter_requests: Counter[str]
    _adapter_lock: threading.Lock

    def _call_args(
        self, input_ids: Any, sampling_params: Any, kwargs: dict[str, Any], context_length: int | None
    ) -> SGLangCall:
        """SGLang's ``generate`` arguments, checked at the engines' front door (:mod:`~lit_agentrl.engines.requests`):
        every engine refuses a malformed request or one longer than its context alike, and these refuse stop strings
        (no tokenizer here); each request with its id and sampling seed."""
        name = type(self).__name__
        return sglang_call(name, input_ids, sampling_params, kwargs, self.streams, context_length, self._image_token_id)

    def _read_model(self, model_path: str) -> None:
        """What the pushes and image requests need to know of the policy: its weights' names and shapes (checked
        before a push), its ``model_type`` (SGLang's weight names) and image placeholder id."""
        config = model_config(model_path)
        self._shapes = expected_weight_shapes(model_path)
        self._model_type, self._image_token_id = config.get("model_type"), config.get("image_token_id")
        self._retired_adapters, self._adapter_requests, self._adapter_lock = [], Counter(), threading.Lock()

    # ------------------------------------------------------------------ LoRA adapters

    @classmethod
    def lora_engine_kwargs(cls, lora: Lora, engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """SGLang serves adapters only when started for them: LoRA on, buffers for the rank and the target modules,
        and strict loading (else an adapter's unmatched tensors are dropped with a warning). On CPU the
        ``torch_native`` LoRA backend (SGLang's default, ``csgmv``, runs Triton kernels)."""
        kwargs: dict[str, Any] = {
            "enable_lora": True,
            "lora_strict_loading": True,
            "max_lora_rank": lora.rank,
            "lora_target_modules": list(lora.target_modules),
        }
        if not _on_accelerator(engine_kwargs.get("device")):
            kwargs["lora_backend"] = "torch_native"
        return kwargs

    def lora_serving_problem(self, lora: Lora) -> str | None:
        """What the running server lacks to serve ``lora``'s adapters, from its ``get_server_info``."""
        info = self._server_info()
        where = f"{type(self).__name__} ({self._where()})"
        if not info.get("enable_lora"):
            flags = " ".join(sglang_group.server_flags(self.lora_engine_kwargs(lora, {})))  # as the trainer starts one
            return f"{where} was started without LoRA: start it with {flags}"
        if int(info.get("max_lora_rank") or 0) < int(lora.rank or 0):
            return (
                f"{where} serves adapters up to rank {info.get('max_lora_rank')} (--max-lora-rank), below {lora.rank}"
            )
        served = set(info.get("lora_target_modules") or ())
        missing = sorted(set(lora.target_modules) - served)
        if "all" not in served and missing:
            return f"{where} serves no adapters on {missing} (--lora-target-modules {' '.join(sorted(served))})"
        if int(info.get("dp_size") or 1) > 1:
            return f"{where} runs {info.get('dp_size')} data-parallel replicas, which load no adapters (SGLang 0.5.23)"
        return None

    def load_lora_adapter(
        self, named_tensors: list[tuple[str, torch.Tensor]], config: dict[str, Any]
    ) -> tuple[bool, str]:
        """Load the adapter under the next name and serve it to every request from now on. Requests in flight
        finish on the adapter they started with; a replaced adapter is unloaded once none of this client's requests
        uses it (SGLang would otherwise make the unload wait for them)."""
        name = _adapter_name(self._adapter_loads + 1)
        tensors = {tensor_name: tensor.detach() for tensor_name, tensor in named_tensors}
        ok, message = _as_pair(self._load_adapter(name, tensors, config))
        if not ok:
            return False, f"SGLang could not load the adapter {name!r}: {message}"
        previous = self.adapter_name
        self.follow_lora_adapter()
        if previous is not None:
            self._retired_adapters.append(previous)
        self._unload_unused_adapters()
        return True, f"serving the adapter {name!r} ({len(tensors)} tensors)"

    @property
    def adapter_name(self) -> str | None:
        """The adapter every request names (``lora_path``) from now on; None: the base weights."""
        return _adapter_name(self._adapter_loads) if self._adapter_loads else None

    def follow_lora_adapter(self) -> None:
        self._adapter_loads += 1

    def _unload_unused_adapters(self) -> None:
        for name in list(self._retired_adapters):
            with self._adapter_lock:
                if self._adapter_requests[name]:
                    continue
            _raise_unless(self._unload_adapter(name), f"unload_lora_adapter({name!r})")
            self._retired_adapters.remove(name)

    @contextlib.contextmanager
    def _serving_adapter(self, call: dict[str, Any]) -> Iterator[str | None]:
        """Within the block, ``call`` names the current adapter (if any) and counts as one of its requests."""
        name = self.adapter_name
        if name is None:
            yield None
            return
        call["lora_path"] = name
        with self._adapter_lock:
            self._adapter_requests[name] += 1
        try:
            yield name
        finally:
            with self._adapter_lock:
                self._adapter_requests[name] -= 1
                if not self._adapter_requests[name]:
                    del self._adapter_requests[name]

    def begin_weight_update(self) -> None:
        _raise_unless(self._call("begin_weight_update"), "begin_weight_update")
        self._in_session = True

    def end_weight_update(self) -> None:
        self._in_session = False
        _raise_unless(self._call("end_weight_update"), "end_weight_update")

    def update_weights_from_tensor(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> tuple[bool, str]:
        """Push ``(name, tensor)`` pairs, checked first (SGLang ignores unknown names and a wrong shape kills
        its scheduler). Opens and closes a session itself unless one is open (:func:`sync_weights` opens one).
        """
        pairs = [(name, tensor.detach()) for name, tensor in named_tensors]
        problem = check_named_tensors(pairs, self._shapes)
        if problem:
            return False, problem
        pairs = checkpoint_names(pairs, self._model_type)  # SGLang's loaders take the checkpoint's names
        own_session = not self._in_session
        if own_session:
            self.begin_weight_update()
        try:
            result = self._push(pairs, load_format, flush_cache)
            if torch.cuda.is_available():  # the bucket's IPC handles are closed: free what they pinned at once
                torch.cuda.ipc_collect()
            return _as_pair(result)
        finally:
            if own_session:
                self.end_weight_update()

    def reseed(self, seed: int) -> None:
        """Restart the sampling streams, as the transformers engines do: each request's ``sampling_seed`` comes from its
        stream (:mod:`~lit_agentrl.engines.sglang_requests`). SGLang samples from it only under
        ``enable_deterministic_inference``; the engines warn when it is off (:func:`warn_unseeded`)."""
        self.streams.reseed(seed)

    @abc.abstractmethod
    def _call(self, what: str) -> Any:
        """Call SGLang's control method ``what`` (no arguments) and return its answer."""

    @abc.abstractmethod
    def _push(self, pairs: list[tuple[str, torch.Tensor]], load_format: str | None, flush_cache: bool) -> Any:
        """Send one checked bucket of weights and return SGLang's answer."""

    @abc.abstractmethod
    def _load_adapter(self, name: str, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Any:
        """Load the adapter ``tensors`` (peft's saved names) with ``config`` under ``name``; SGLang's answer."""

    @abc.abstractmethod
    def _unload_adapter(self, name: str) -> Any:
        """Unload the adapter ``name``; SGLang's answer."""

    @abc.abstractmethod
    def _server_info(self) -> dict[str, Any]:
        """SGLang's ``get_server_info``: its server arguments, among others."""

    @abc.abstractmethod
    def _where(self) -> str:
        """The engine in words, for messages."""


@register_engine("sglang")
class SGLangEngine(_SGLangBase):
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
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
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
        return _as_pair(self._engine.update_weights_from_disk(model_path))

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


@register_engine("sglang_http")
class SGLangHTTPEngine(_SGLangBase):
    """An already running SGLang server (``python -m sglang.launch_server --skip-tokenizer-init ...``).

    Args:
        url: the server's base URL, e.g. ``http://10.0.0.5:30000``.
        model_path: a local copy of the served model's config (the policy's path), to check weight names
            and shapes before they are sent.
        timeout_s: per-request timeout.
        tp_size: the server's tensor-parallel size (one weight payload per rank).
        owner: whether this rank pushes the weights and releases and resumes the server's memory.
        transport: ``inline``: weights travel in the request (pickled, base64), which suits small models, tests and
            remote servers; ``ipc``: GPU tensors travel as CUDA IPC handles (SGLang's flattened bucket), for a server
            on the same node (a group's); CPU tensors still travel inline.
        server: the server's process when this rank started it (stopped at :meth:`shutdown`).
        seed: the seed of the requests' sampling streams until the first :meth:`reseed`.

    Servers are shared by several training ranks (``shared = True``): one ``owner`` pushes weights, the others
    wait for it. ``sglang_http`` servers (started by the user) are shared by all ranks and owned by rank 0; a
    group's server (:meth:`for_group`) by its group, owned by the rank that started it. Large models belong on
    ``ipc`` or the servers' own update paths (disk, NCCL) rather than ``inline``. As for :class:`SGLangEngine`,
    ``busy_seconds`` is None, and each request carries a ``sampling_seed`` from its trajectory, which the server samples
    from only when started with ``--enable-deterministic-inference`` (the client warns at its first request without
    it). ``context_length`` is the server's (its ``/v1/models`` ``max_model_len``, SGLang's own limit), read at the
    first request or the first time it is asked for. A call that is cancelled (a trajectory's timeout) or fails sends
    ``/abort_request`` for each of its requests.
    """

    shared = True
    generates_beside_trainer = True  # a separate server; one async client per event loop
    updates_while_generating = True  # a push pauses the server and continues its requests on the new weights

    @classmethod
    def build(
        cls, model_path: str, seed: int = 0, placement: EnginePlacement | None = None, **kwargs: Any
    ) -> list[RolloutEngine]:
        """One client per server in ``engine.kwargs.urls``; ``seed`` and ``placement`` are unused (the servers
        have their own seeds and GPUs).
        """
        urls = kwargs.pop("urls", None)
        if not urls:
            raise UserInputError("engine 'sglang_http' needs engine.kwargs.urls: a list of SGLang server URLs")
        owner = placement is None or placement.global_rank == 0
        return [cls(url, model_path, owner=owner, seed=seed, **kwargs) for url in urls]

    @classmethod
    def for_group(
        cls, model_path: str, seed: int, placement: EnginePlacement, engine_kwargs: dict[str, Any]
    ) -> SGLangHTTPEngine:
        """This rank's client of its group's server, which the group's first rank starts (and waits for) here."""
        server_args = placed_group_args(engine_kwargs, placement)
        group_port = int(server_args.pop("group_port", sglang_group.DEFAULT_GROUP_PORT))
        timeout_s = float(server_args.pop("timeout_s", 600.0))
        server_args.pop("flattened_bucket", None)  # the client always sends flattened buckets over ipc
        url = sglang_group.group_url(placement, group_port)
        server = None
        if placement.starts_engine:
            command = sglang_group.server_command(
                model_path, seed + placement.global_rank, placement, server_args, group_port
            )
            server = sglang_group.start_server(command, server_env(model_path))
        try:
            sglang_group.wait_until_healthy(url, server)
        except BaseException:
            if server is not None:
                sglang_group.stop_server(server)
            raise
        return cls(
            url,
            model_path,
            timeout_s=timeout_s,
            tp_size=placement.tp_size,
            owner=placement.starts_engine,
            transport="ipc",
            server=server,
            seed=seed,
        )

    def __init__(
        self,
        url: str,
        model_path: str,
        timeout_s: float = 600.0,
        tp_size: int = 1,
        owner: bool = True,
        transport: str = "inline",
        server: Any = None,
        seed: int = 0,
    ) -> None:
        import httpx

        if transport not in ("inline", "ipc"):
            raise UserInputError(f"engine.kwargs.transport must be 'inline' or 'ipc', got {transport!r}")
        self.url = url.rstrip("/")
        self._read_model(model_path)
        self.tp_size, self.owner, self.transport, self._server = tp_size, owner, transport, server
        self._timeout = timeout_s
        self._sync = httpx.Client(base_url=self.url, timeout=timeout_s)
        self._async: dict[int, Any] = {}  # one async client per event loop
        self.streams = StreamKeys(seed)
        self._context_length: int | None = None
        self._facts_read = False  # the server's context length and seeding, read once

    @property
    def context_length(self) -> int | None:  # type: ignore[override]
        """The server's context length (its ``/v1/models`` ``max_model_len``), asked of it the first time."""
        if not self._facts_read:
            models = self._sync.get("/v1/models")
            models.raise_for_status()
            self._note_facts(models.json(), self._server_info())
        return self._context_length

    async def _read_facts(self) -> None:
        """What the first request needs to know of the server: its context length, and whether it seeds by request."""
        models, info = await asyncio.gather(self._client().get("/v1/models"), self._client().get("/get_server_info"))
        models.raise_for_status()
        info.raise_for_status()
        self._note_facts(models.json(), dict(info.json()))

    def _note_facts(self, models: dict[str, Any], server_info: dict[str, Any]) -> None:
        if self._facts_read:
            return
        lengths = [entry.get("max_model_len") for entry in models.get("data") or []]
        self._context_length = next((int(n) for n in lengths if n), None)
        self._facts_read = True
        warn_unseeded(self.url, server_info)

    @classmethod
    def lora_engine_kwargs(cls, lora: Lora, engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """None: the servers are the user's, started with their own flags (checked by :meth:`lora_serving_problem`)."""
        return {}

    def _client(self) -> Any:
        import asyncio

        import httpx

        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._async:
            self._async[loop_id] = httpx.AsyncClient(base_url=self.url, timeout=self._timeout)
        return self._async[loop_id]

    async def async_generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        return_logprob: bool = False,
        **kwargs: Any,
    ) -> GenerateResult | list[GenerateResult]:
        if not self._facts_read:
            await self._read_facts()
        call = self._call_args(input_ids, sampling_params, kwargs, self._context_length)
        body = {**call.kwargs, "return_logprob": return_logprob}
        if "image_data" in body:  # PIL images travel as data URLs (SGLang loads those)
            body["image_data"] = _jsonable_images(body["image_data"])
        tag, version = current_tag(), self.weight_version
        with self._serving_adapter(body) as adapter:
            try:
                response = await self._client().post("/generate", json=body)
            except BaseException:  # cancelled (a trajectory's timeout) or cut off: the server would compute on
                await _finish(self.abort(call.rids))
                raise
        response.raise_for_status()
        result = response.json()
        if tag is not None:  # a push while the request ran continued it on newer weights (partial rollouts), unless
            # the request named an adapter: that one served all of it
            tag.gate.note_version(tag.key, version if adapter is not None else self.weight_version)
        for item in result if isinstance(result, list) else [result]:
            meta = item["meta_info"]
            if meta.get("output_token_logprobs") is not None:
                meta["output_token_logprobs"] = [tuple(entry) for entry in meta["output_token_logprobs"]]
        return result

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self._sync.post(path, json=body or {})
        if response.status_code >= 400:
            return {"success": False, "message": f"{path}: HTTP {response.status_code}: {response.text[:500]}"}
        try:
            return response.json()
        except ValueError:
            return {"success": True, "message": response.text}

    def _call(self, what: str) -> Any:
        return self._post(f"/{what}")

    def begin_weight_update(self) -> None:
        """Pause the server, then open SGLang's update session. The pause (``pause_generation``, ``retract``) sends
        the requests in flight back to the queue, keeping their tokens and log-probs and freeing their KV, so a push
        neither waits for them nor lands between the layers of a step; after :meth:`end_weight_update` they continue
        on the new weights, their KV computed again (``partial_rollouts``)."""
        _raise_unless(self._post("/pause_generation", {"mode": "retract"}), "pause_generation")
        try:
            super().begin_weight_update()
        except BaseException:
            self._post("/continue_generation")
            raise

    def end_weight_update(self) -> None:
        try:
            super().end_weight_update()
        finally:
            _raise_unless(self._post("/continue_generation"), "continue_generation")

    def _push(self, pairs: list[tuple[str, torch.Tensor]], load_format: str | None, flush_cache: bool) -> Any:
        """One payload per tensor-parallel rank: CUDA IPC handles of a flattened bucket (``ipc``, GPU tensors), or
        the pickled tensors themselves, base64 (``inline``)."""
        if self.transport == "ipc" and load_format is None and pairs and pairs[0][1].is_cuda:
            payloads, ipc_format = ipc_payloads(pairs, self.tp_size)
            body = {"serialized_named_tensors": payloads, "load_format": ipc_format, "flush_cache": flush_cache}
            return self._post("/update_weights_from_tensor", body)
        cpu_pairs = [(name, tensor.cpu().contiguous()) for name, tensor in pairs]
        payload = base64.b64encode(pickle.dumps(cpu_pairs)).decode()
        body = {
            "serialized_named_tensors": [payload] * self.tp_size,
            "load_format": load_format,
            "flush_cache": flush_cache,
        }
        return self._post("/update_weights_from_tensor", body)

    def _load_adapter(self, name: str, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Any:
        """The tensors as CUDA IPC handles (``ipc``, GPU tensors) or pickled, base64 (``inline``), one per rank."""
        if self.transport == "ipc" and any(tensor.is_cuda for tensor in tensors.values()):
            from sglang.srt.utils import MultiprocessingSerializer

            payload = MultiprocessingSerializer.serialize(tensors, output_str=True)
        else:
            cpu = {tensor_name: tensor.cpu().contiguous() for tensor_name, tensor in tensors.items()}
            payload = base64.b64encode(pickle.dumps(cpu)).decode()
        body = {"lora_name": name, "config_dict": config, "serialized_named_tensors": [payload] * self.tp_size}
        return self._post("/load_lora_adapter_from_tensors", body)

    def _unload_adapter(self, name: str) -> Any:
        return self._post("/unload_lora_adapter", {"lora_name": name})

    def _server_info(self) -> dict[str, Any]:
        response = self._sync.get("/get_server_info")
        response.raise_for_status()
        return dict(response.json())

    def _where(self) -> str:
        return self.url

    def abort_all(self) -> None:
        """Abort every request in flight on the server (e.g. a rollout past its deadline)."""
        self._post("/abort_request", {"rid": "", "abort_all": True})

    async def abort(self, rids: list[str]) -> None:
        """Abort the requests ``rids`` on the server (``/abort_request``): each leaves its queue or running batch."""
        responses = await asyncio.gather(*(self._client().post("/abort_request", json={"rid": r}) for r in rids))
        for response in responses:
            if response.status_code >= 400:
                log.warning(
                    "SGLang at %s did not abort a request: HTTP %d %s",
                    self.url,
                    response.status_code,
                    response.text[:300],
                )

    def flush_cache(self) -> bool:
        return bool(_as_pair(self._post("/flush_cache"))[0])

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        _raise_unless(self._post("/release_memory_occupation", {"tags": tags}), "release_memory_occupation")

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        _raise_unless(self._post("/resume_memory_occupation", {"tags": tags}), "resume_memory_occupation")

    def shutdown(self) -> None:
        """Close the connections, and stop the server if this rank started it (else it is not ours to stop)."""
        self._sync.close()
        self._async.clear()
        if self._server is not None:
            sglang_group.stop_server(self._server)
            self._server = None


def placed_server_args(engine_kwargs: dict[str, Any], placement: EnginePlacement | None) -> dict[str, Any]:
    """``engine.kwargs`` for an in-process engine of the rank at ``placement``: on its own GPUs.

    On an accelerator (``device`` unset with CUDA available, or any device but ``cpu``/``mps``) the engine gets
    ``base_gpu_id`` = the first GPU of the rank's group (:class:`EnginePlacement`), where SGLang would put every
    rank's engine on GPU 0; a ``base_gpu_id`` in ``engine.kwargs`` is kept (and logged). Without a placement (an
    engine built outside a trainer) ``engine.kwargs`` are returned unchanged.
    """
    kwargs = dict(engine_kwargs)
    if placement is None or not _on_accelerator(kwargs.get("device")):
        return kwargs
    plan = placement.with_tp_size(int(kwargs.get("tp_size", 1)))
    if "base_gpu_id" in kwargs:
        log.info(
            "engine 'sglang' on rank %d: engine.kwargs.base_gpu_id=%s is kept (the placement would be GPU %d)",
            plan.global_rank,
            kwargs["base_gpu_id"],
            plan.base_gpu_id,
        )
        return kwargs
    kwargs["base_gpu_id"] = plan.base_gpu_id
    return kwargs


def rank_nccl_port(placement: EnginePlacement, base: int = sglang_group.DEFAULT_GROUP_PORT + 100) -> int:
    """The port where the in-process engine of the rank at ``placement`` rendezvous its scheduler's process group:
    ``base`` + the global rank, or the first free one all ranks further on (``engine.kwargs.nccl_port`` wins). The
    global rank keeps apart the ranks of one node, and also of "nodes" that share one machine (a rehearsal).

    Left unset, SGLang 0.5.23 draws it with Python's global ``random`` (``PortArgs.init_new`` ->
    ``get_free_port_below_ephemeral``), which ``seed_everything`` seeds alike on every rank, and every rank builds
    its engine right after the same barrier: the ranks of a node would draw the same port and all but one fail.
    """
    for port in range(base + placement.global_rank, 65536, placement.world_size):
        if _port_is_free(port):
            return port
    raise RuntimeError(f"no free port from {base + placement.global_rank} up for the engine's rendezvous")


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))  # as SGLang's TCP store binds it
        except OSError:
            return False
    return True


def placed_group_args(engine_kwargs: dict[str, Any], placement: EnginePlacement) -> dict[str, Any]:
    """``engine.kwargs`` for the server a group of ranks shares: placed as :func:`placed_server_args` places an
    in-process engine (on CPU SGLang reads ``base_gpu_id`` as a NUMA node, so it is left unset there)."""
    kwargs = placed_server_args(engine_kwargs, placement)
    kwargs["tp_size"] = placement.tp_size
    return kwargs


def flattened_payloads(pairs: list[tuple[str, torch.Tensor]], tp_size: int) -> list[str]:
    """One serialized flattened bucket per tensor-parallel rank (SGLang's ``flattened_bucket`` format): GPU tensors
    travel as CUDA IPC handles, so the receiver must be on the same node."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    bucket = FlattenedTensorBucket(named_tensors=pairs)
    payload = {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}
    return [MultiprocessingSerializer.serialize(payload, output_str=True) for _ in range(tp_size)]


def ipc_payloads(pairs: list[tuple[str, torch.Tensor]], tp_size: int) -> tuple[list[str], str | None]:
    """One payload per tensor-parallel rank, and its ``load_format``: a bucket of several tensors flattened into one
    (:func:`flattened_payloads`), a single tensor serialized as it is (its own IPC handle, no flattened copy)."""
    if len(pairs) > 1:
        return flattened_payloads(pairs, tp_size), "flattened_bucket"
    from sglang.srt.utils import MultiprocessingSerializer

    return [MultiprocessingSerializer.serialize(pairs, output_str=True) for _ in range(tp_size)], None


VLM_CACHE_ENV = "SGLANG_VLM_CACHE_SIZE_MB"
"""SGLang keeps each image's vision-tower output, keyed by the image, across weight pushes and cache flushes (its
multimodal embedding cache, 100 MB by default): after a push, an image seen before would be encoded by the old vision
tower. 0 turns the cache off."""


def server_env(model_path: str) -> dict[str, str]:
    """Environment an SGLang server over ``model_path`` needs for training: a vision-language model's runs without the
    vision embedding cache (:data:`VLM_CACHE_ENV`)."""
    return {VLM_CACHE_ENV: "0"} if is_vision_language(model_path) else {}


async def _finish(work: Any) -> None:
    """Run ``work`` (an abort) to its end even if the awaiting task is cancelled again meanwhile (shielded, it goes on
    without the task); its failure is logged, never raised over the error being handled."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(_log_failure)
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.shield(task)


def _log_failure(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("aborting SGLang requests failed: %r", task.exception())


def _jsonable_images(image_data: Any) -> Any:
    """``image_data`` for a JSON request: each PIL image as a PNG ``data:`` URL, lists kept, anything else as is."""
    if isinstance(image_data, (list, tuple)):
        return [_jsonable_images(item) for item in image_data]
    if hasattr(image_data, "save") and hasattr(image_data, "mode"):  # a PIL image
        import base64
        import io

        buffer = io.BytesIO()
        image_data.save(buffer, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    if isinstance(image_data, bytes):
        import base64

        return "data:image/png;base64," + base64.b64encode(image_data).decode("ascii")
    return image_data


def _on_accelerator(device: Any) -> bool:
    """Whether SGLang will run on a numbered accelerator: ``device`` as configured (None: SGLang detects it)."""
    if device is None:
        return torch.cuda.is_available()
    return str(device).split(":", 1)[0] not in ("cpu", "mps")


def _as_pair(result: Any) -> tuple[bool, str]:
    """SGLang answers ``(success, message)``, an object with ``success``/``message``, or a JSON dict."""
    if isinstance(result, tuple):
        return bool(result[0]), str(result[1]) if len(result) > 1 else ""
    if isinstance(result, dict):
        return bool(result.get("success", True)), str(result.get("message") or result.get("error_message") or "")
    message = getattr(result, "message", None) or getattr(result, "error_message", None)  # LoRA answers: the latter
    return bool(getattr(result, "success", True)), str(message or "")


def _raise_unless(result: Any, what: str) -> None:
    ok, message = _as_pair(result)
    if not ok:
        raise RuntimeError(f"SGLang {what} failed: {message}")
