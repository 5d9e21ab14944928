"""Already running SGLang servers (``engine: sglang_http``), and the server a group of ranks shares
(:meth:`SGLangHTTPEngine.for_group`): SGLang's native HTTP API, token in / token out.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lit_agentrl.context import current_tag
from lit_agentrl.engines import sglang_group
from lit_agentrl.engines.base import GenerateResult, RolloutEngine
from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.engines.registry import register_engine
from lit_agentrl.engines.requests import StreamKeys
from lit_agentrl.engines.sglang_base import SGLangBase, as_pair, ipc_payloads, raise_unless, server_env
from lit_agentrl.engines.sglang_placement import placed_group_args
from lit_agentrl.engines.sglang_requests import warn_unseeded
from lit_agentrl.engines.weight_collective import WeightGroup
from lit_agentrl.engines.weight_files import bucket_folder, checked_weights_dir
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.dtypes import TORCH_DTYPES
from lit_agentrl.models.processors import model_config

if TYPE_CHECKING:
    from lit_agentrl.config.training import Lora

log = logging.getLogger(__name__)

TRANSPORTS = ("inline", "ipc", "disk", "collective")
"""``engine.kwargs.transport`` of ``sglang_http``: how a push reaches the server (see :class:`SGLangHTTPEngine`)."""


@register_engine("sglang_http")
class SGLangHTTPEngine(SGLangBase):
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
            on the same node (a group's); CPU tensors still travel inline; ``disk``: each bucket is written as a
            safetensors file under ``weights_dir`` and the server loads it (``/update_weights_from_disk``), for
            servers on other nodes that share storage with the trainer (:mod:`lit_agentrl.engines.weight_files`);
            ``collective``: the owner and the server's ranks form a process group of their own and each bucket is
            broadcast over it (``/update_weights_from_distributed``: NCCL between GPUs, gloo on CPU;
            :mod:`lit_agentrl.engines.weight_collective`). LoRA adapters travel inline under ``disk`` and
            ``collective`` (SGLang 0.5.23 loads adapters from tensors or files, not over a group).
        weights_dir: with ``transport: disk``, the shared folder (the same path for the trainer and the servers).
        collective_backend: with ``transport: collective``, ``nccl`` (GPUs) or ``gloo`` (CPUs).
        collective_address: with ``transport: collective``, the trainer's address the server reaches its store at
            (default: this machine's address on the route to the server).
        collective_port: with ``transport: collective``, the store's port (default: a free one).
        server: the server's process when this rank started it (stopped at :meth:`shutdown`).
        seed: the seed of the requests' sampling streams until the first :meth:`reseed`.

    Servers are shared by several training ranks (``shared = True``): one ``owner`` pushes weights, the others
    wait for it. ``sglang_http`` servers (started by the user) are shared by all ranks and owned by rank 0; a
    group's server (:meth:`for_group`) by its group, owned by the rank that started it. Large models belong on
    ``ipc`` or the servers' own update paths (disk, NCCL) rather than ``inline``. As for :class:`~lit_agentrl.engines.sglang.SGLangEngine`,
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
        """One client per server in ``engine.kwargs.urls``; ``seed`` starts the requests' sampling streams (until the
        first :meth:`reseed`), ``placement`` is unused (the servers have their own GPUs).
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
        weights_dir: str | None = None,
        collective_backend: str = "nccl",
        collective_address: str | None = None,
        collective_port: int | None = None,
    ) -> None:
        import httpx

        if transport not in TRANSPORTS:
            raise UserInputError(f"engine.kwargs.transport must be one of {list(TRANSPORTS)}, got {transport!r}")
        self.weights_dir = checked_weights_dir(weights_dir) if transport == "disk" and owner else None
        self.url = url.rstrip("/")
        self.weight_group: WeightGroup | None = None
        if transport == "collective" and owner:
            self.weight_group = WeightGroup(
                self._post, self.url, collective_backend, tp_size, collective_address, collective_port, timeout_s
            )
        self._read_model(model_path)
        self.tp_size, self.owner, self.transport, self._server = tp_size, owner, transport, server
        self._timeout = timeout_s
        self._sync = httpx.Client(base_url=self.url, timeout=timeout_s)
        self._async: dict[int, Any] = {}  # one async client per event loop
        self.streams = StreamKeys(seed)
        self._context_length: int | None = None
        self._facts_read = False  # the server's context length and seeding, read once
        self._model_path = model_path
        self._weight_dtype: torch.dtype | None = None

    @property
    def weight_dtype(self) -> torch.dtype | None:  # type: ignore[override]
        """The dtype the server holds its weights in (its ``--dtype``; ``auto``: the checkpoint's), asked of it once:
        pushes travel in it (a bf16 server gets half the bytes of the fp32 master weights)."""
        if self._weight_dtype is None:
            name = str(self._server_info().get("dtype") or "auto")
            if name == "auto":
                config = model_config(self._model_path)
                name = str(config.get("torch_dtype") or config.get("dtype") or "float32")
            self._weight_dtype = TORCH_DTYPES.get(name, torch.float32)
        return self._weight_dtype

    @property
    def context_length(self) -> int | None:  # type: ignore[override]
        """The server's context length (its ``/v1/models`` ``max_model_len``), asked of it the first time."""
        if not self._facts_read:
            models = self._sync.get("/v1/models")
            models.raise_for_status()
            self._note_facts(models.json(), self._server_info())
        return self._context_length

    async def _read_facts(self) -> None:
        """What the first request needs to know of the server: its context length, and whether it seeds by request.
        Asked twice at most: a busy server may drop a connection before it answers, and the questions change nothing."""
        import httpx

        for attempt in (1, 2):
            try:
                models = await self._client().get("/v1/models")
                info = await self._client().get("/get_server_info")
                break
            except httpx.TransportError:
                if attempt == 2:
                    raise
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
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None = None,
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
                response = await self._client().post("/generate", json=body, headers=self._route_headers(call.rids))
            except BaseException:  # cancelled (a trajectory's timeout) or cut off: the server would compute on
                await _finish(self.abort(call.rids))
                raise
        self._check_generated(response)
        result = response.json()
        if tag is not None:  # a push while the request ran continued it on newer weights (partial rollouts), unless
            # the request named an adapter: that one served all of it
            tag.gate.note_version(tag.key, version if adapter is not None else self.weight_version)
        for item in result if isinstance(result, list) else [result]:
            meta = item["meta_info"]
            if meta.get("output_token_logprobs") is not None:
                meta["output_token_logprobs"] = [tuple(entry) for entry in meta["output_token_logprobs"]]
        return result

    def _route_headers(self, rids: list[str]) -> dict[str, str]:
        """Headers of a ``/generate`` request (a router's routing key; none to a server itself)."""
        return {}

    def _check_generated(self, response: Any) -> None:
        """Raise for a ``/generate`` answer that carries no result."""
        response.raise_for_status()

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
        raise_unless(self._post("/pause_generation", {"mode": "retract"}), "pause_generation")
        try:
            super().begin_weight_update()
        except BaseException:
            self._post("/continue_generation")
            raise

    def end_weight_update(self) -> None:
        try:
            super().end_weight_update()
        finally:
            raise_unless(self._post("/continue_generation"), "continue_generation")

    def _push(self, pairs: list[tuple[str, torch.Tensor]], load_format: str | None, flush_cache: bool) -> Any:
        """One payload per tensor-parallel rank: CUDA IPC handles of a flattened bucket (``ipc``, GPU tensors), or
        the pickled tensors themselves, base64 (``inline``), or a file the server reads (``disk``), or a broadcast
        over the weight-update group (``collective``)."""
        if self.weight_group is not None and load_format is None:
            return self.weight_group.send(pairs, flush_cache)
        if self.weights_dir is not None and load_format is None:
            with bucket_folder(self.weights_dir, pairs) as folder:
                return self._load_folder(folder, flush_cache)
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

    def _load_folder(self, folder: Path, flush_cache: bool) -> Any:
        """Have the server load the safetensors in ``folder`` (a bucket written by :func:`bucket_folder`)."""
        return self._post("/update_weights_from_disk", {"model_path": str(folder), "flush_cache": flush_cache})

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
        return bool(as_pair(self._post("/flush_cache"))[0])

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        raise_unless(self._post("/release_memory_occupation", {"tags": tags}), "release_memory_occupation")

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        raise_unless(self._post("/resume_memory_occupation", {"tags": tags}), "resume_memory_occupation")

    def shutdown(self) -> None:
        """Leave the weight-update group, close the connections, and stop the server if this rank started it (else
        it is not ours to stop)."""
        if self.weight_group is not None:
            self.weight_group.close()
            self.weight_group = None
        self._sync.close()
        self._async.clear()
        if self._server is not None:
            sglang_group.stop_server(self._server)
            self._server = None


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
