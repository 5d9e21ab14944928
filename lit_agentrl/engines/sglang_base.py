"""What both SGLang engines share (:class:`SGLangBase`): SGLang 0.5.23's weight-update session around checked pushes,
LoRA adapters loaded from tensors and named in every request, each request's id and sampling seed
(:mod:`~lit_agentrl.engines.sglang_requests`); and the helpers both use (weight payloads, SGLang's answers, the
environment a server needs). The engines themselves: :mod:`~lit_agentrl.engines.sglang` (in process) and
:mod:`~lit_agentrl.engines.sglang_http` (servers).
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from lit_agentrl.engines import sglang_group
from lit_agentrl.engines.base import RolloutEngine, check_named_tensors, expected_weight_shapes
from lit_agentrl.engines.requests import StreamKeys
from lit_agentrl.engines.sglang_requests import SGLangCall, sglang_call
from lit_agentrl.engines.weight_names import checkpoint_names
from lit_agentrl.models.processors import is_vision_language, model_config

if TYPE_CHECKING:
    from lit_agentrl.config.training import Lora

ADAPTER_NAME = "lit-agentrl-policy"
"""The policy's adapters are served as ``<ADAPTER_NAME>-<n>``, the n-th loaded (SGLang loads each name once)."""


def _adapter_name(loads: int) -> str:
    return f"{ADAPTER_NAME}-{loads}"


class SGLangBase(RolloutEngine):
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
        if not on_accelerator(engine_kwargs.get("device")):
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
        ok, message = as_pair(self._load_adapter(name, tensors, config))
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
            raise_unless(self._unload_adapter(name), f"unload_lora_adapter({name!r})")
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
        raise_unless(self._call("begin_weight_update"), "begin_weight_update")
        self._in_session = True

    def end_weight_update(self) -> None:
        self._in_session = False
        raise_unless(self._call("end_weight_update"), "end_weight_update")

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
            return as_pair(result)
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


def on_accelerator(device: Any) -> bool:
    """Whether SGLang will run on a numbered accelerator: ``device`` as configured (None: SGLang detects it)."""
    if device is None:
        return torch.cuda.is_available()
    return str(device).split(":", 1)[0] not in ("cpu", "mps")


def as_pair(result: Any) -> tuple[bool, str]:
    """SGLang answers ``(success, message)``, an object with ``success``/``message``, or a JSON dict."""
    if isinstance(result, tuple):
        return bool(result[0]), str(result[1]) if len(result) > 1 else ""
    if isinstance(result, dict):
        return bool(result.get("success", True)), str(result.get("message") or result.get("error_message") or "")
    message = getattr(result, "message", None) or getattr(result, "error_message", None)  # LoRA answers: the latter
    return bool(getattr(result, "success", True)), str(message or "")


def raise_unless(result: Any, what: str) -> None:
    ok, message = as_pair(result)
    if not ok:
        raise RuntimeError(f"SGLang {what} failed: {message}")
