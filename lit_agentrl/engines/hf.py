"""A transformers rollout engine that imitates ``sglang.Engine`` in-process (CPU, development, tests).

Requests from any number of coroutines are served by one scheduler thread that keeps a single running
batch with a shared KV cache (continuous batching): new requests are prefilled and merged into the
batch between decode steps, finished rows leave it at once, so they stop costing compute, and the
asyncio loop that runs the agents is never blocked by model compute. Identical prompts admitted together
are prefilled once, and a request that extends a finished one (an agent's next turn) prefills only its new
tokens, from the finished request's KV kept in a :class:`~lit_agentrl.engines.prefix_cache.PrefixCache`.
Each request counts its own generated tokens (for the frequency, presence and repetition penalties) and, when it
has ``stop`` strings, looks for them in its decoded output with the model's tokenizer, loaded on first need.

This module is the API and the scheduler; the running batch and its KV cache live in
:mod:`~lit_agentrl.engines.running_batch`, the sampler in :mod:`~lit_agentrl.engines.sampling`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer, DynamicCache

from lit_agentrl.dtypes import torch_dtype
from lit_agentrl.engines.admission import ROLLOUT_TRAJECTORY, AdmissionGate, TrajectoryTag, request_order
from lit_agentrl.engines.base import GenerateResult, RolloutEngine, check_named_tensors
from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.engines.prefix_cache import CachedPrefix, PrefixCache
from lit_agentrl.engines.registry import register_engine
from lit_agentrl.engines.running_batch import RunningBatch, cache_with_prefixes, select_rows
from lit_agentrl.engines.sampling import SamplingParams, sample_tokens
from lit_agentrl.errors import UserInputError
from lit_agentrl.processors import image_digest, is_vision_language, load_image, mrope_position_ids, vision_settings

log = logging.getLogger(__name__)


@dataclass
class _Images:
    """A vision-language request's images as the model takes them, and its M-RoPE positions."""

    pixel_values: torch.Tensor  # [N, D]: every image's patches
    grids: torch.Tensor  # [k, 3]
    patches: list[int]  # rows of pixel_values per image
    spans: list[tuple[int, int]]  # each image's tokens in the prompt: [start, end)
    digests: tuple[str, ...]  # the images' identity: the prefix cache's scope
    positions: torch.Tensor  # [3, P]: the whole prompt's rotary positions
    rope_delta: int  # positions after the prompt: index + rope_delta


@dataclass
class _Request:
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    future: concurrent.futures.Future
    rng: random.Random
    stop_window: int = 0  # trailing output tokens decoded to look for stop strings (0: none)
    tag: TrajectoryTag | None = None  # the rollout trajectory that sent it (see engines.admission)
    order: tuple[Any, ...] = ()  # its place in an admission: by trajectory and turn, not arrival
    images: _Images | None = None  # a vision-language request's images
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    counts: torch.Tensor | None = None  # [V]: how often this request generated each token (penalties only)

    @property
    def next_position(self) -> int:
        """Position of the last sampled token, the one fed to the next decode step (M-RoPE: in every component)."""
        delta = self.images.rope_delta if self.images is not None else 0
        return len(self.input_ids) + len(self.output_ids) - 1 + delta

    @property
    def scope(self) -> tuple[str, ...]:
        """Its images' digests (empty for text): what its KV depends on besides the token ids."""
        return self.images.digests if self.images is not None else ()


@register_engine("transformers")
class TransformersEngine(RolloutEngine):
    generates_beside_trainer = True  # its own scheduler thread serves any event loop
    updates_while_generating = True  # updates pause the scheduler between model steps

    """An in-process engine over a Hugging Face causal LM with SGLang's ``Engine`` API.

    Args:
        model_path: local directory of a ``save_pretrained`` model.
        device: torch device for the engine's own copy of the weights. Built by a trainer (:meth:`build`),
            ``cuda`` without an index means the rank's own GPU, ``cuda:<local rank>``.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        max_running_requests: most sequences decoded together; more wait in the queue.
        seed: with the request's trajectory and turn (or, outside a rollout, its submission order), it seeds the
            request's own sampling stream (SGLang's per-request ``sampling_seed`` overrides it), so samples do not
            depend on batch composition.
        deterministic: admit a rollout's requests only when all its running trajectories wait on the engine, in
            trajectory order (:mod:`~lit_agentrl.engines.admission`), so batches, log-probs and samples do not
            depend on timing: what makes a resumed run equal an unbroken one. The price: every step waits for the
            slowest agent's Python and tools between turns, and a hanging tool holds every trajectory until its
            timeout. False (default): admit by arrival (``admission_window_s``); requests from outside a rollout
            manager are always admitted so.
        admission_window_s: an idle engine keeps gathering requests while the next one arrives within this.
        max_admission_wait_s: an idle engine starts at most this long after its first request arrived.
        prefix_cache_mb: memory for finished requests' KV, reused by requests that extend them (0: off).
            Flushed by every weight update, as SGLang flushes its radix cache.

    Sampling follows SGLang (:mod:`~lit_agentrl.engines.sampling`): frequency/presence/repetition penalties on
    the request's generated tokens (not its prompt), on the raw logits, before temperature and truncation.
    Logprobs are those of the sampled token under the temperature-scaled distribution of the penalised logits
    (before top-k/top-p/min-p truncation), as SGLang returns them; without penalties that is what the trainer
    recomputes. Greedy requests (temperature 0) use temperature 1.

    ``stop`` strings (SGLang 0.5.23's semantics, ``sglang/srt/managers/schedule_batch.py`` 1911-1932, 2007-2040):
    after each token the last ``stop_window`` output tokens are decoded with the model's tokenizer (loaded from
    ``model_path`` on the first request that has stop strings); when one of the strings occurs there, the request
    finishes with ``{"type": "stop", "matched": <the string>}``, keeping every token generated so far in
    ``output_ids`` (SGLang trims the stop string from its text only, never from the ids: ``output_ids_through_stop``,
    1509-1513, "Stop position is included"). Stop strings are checked
    before stop tokens and before the length limit, and ``ignore_eos`` does not turn them off.

    Vision-language models (a ``vision_config`` in the model's config; loaded with ``AutoModelForImageTextToText``):
    a request carries its images as ``image_data`` (SGLang's name): per prompt, a list of images (PIL images,
    paths, ``data:`` URLs, bytes), preprocessed with the model folder's image processor, or one dict
    ``{"pixel_values", "image_grid_thw"}`` of processor output. The prompt's ids already hold each image's widened
    placeholder. Prefill computes Qwen2-VL's 3-D rotary positions from the ids and image grids, decode steps continue
    at ``index + rope_delta``; kept prefixes match only requests with the same images.

    Example::

        engine = TransformersEngine(".cache/tiny-qwen3")
        out = await engine.async_generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 8},
                                          return_logprob=True)
    """

    @classmethod
    def build(
        cls, model_path: str, seed: int = 0, placement: EnginePlacement | None = None, **kwargs: Any
    ) -> list[RolloutEngine]:
        """One engine; ``device: cuda`` (no index) becomes the rank's own GPU, ``cuda:<local rank>``."""
        if "device" in kwargs:
            kwargs["device"] = cls.rank_device(kwargs["device"], placement)
        return [cls(model_path, seed=seed, **kwargs)]

    @staticmethod
    def rank_device(device: str | None, placement: EnginePlacement | None) -> str | None:
        """``device``, with ``cuda`` (no index) made the rank's own GPU when ``placement`` says which it is."""
        if placement is not None and device is not None and torch.device(device) == torch.device("cuda"):
            return f"cuda:{placement.local_rank}"
        return device

    def __init__(
        self,
        model_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        max_running_requests: int = 256,
        seed: int = 0,
        deterministic: bool = False,
        admission_window_s: float = 0.002,
        max_admission_wait_s: float = 0.02,
        prefix_cache_mb: float = 256,
    ) -> None:
        torch_type = torch_dtype(dtype, where="engine_kwargs.dtype")
        if max_running_requests < 1:
            raise UserInputError(f"max_running_requests must be >= 1, got {max_running_requests}")
        self.model_path = model_path
        self.device = torch.device(device)
        auto = AutoModelForImageTextToText if is_vision_language(model_path) else AutoModelForCausalLM
        model: Any = auto.from_pretrained(model_path, dtype=torch_type)  # its ``to`` is mistyped
        self.model: Any = model.to(self.device).eval()
        self.vision = vision_settings(self.model)  # (image token id, merge size); None for a text model
        self._image_processor: Any = None  # loaded for the first request with images
        self.model.requires_grad_(False)
        # transformers 5.x renamed ``past_key_values`` to ``cache``; accept either release line.
        forward_args = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_args else "past_key_values"
        eos = self.model.generation_config.eos_token_id
        self.eos_token_ids: frozenset[int] = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self.max_running_requests = max_running_requests
        self.deterministic = deterministic
        self.admission_window_s = admission_window_s
        self.max_admission_wait_s = max_admission_wait_s
        self.seed = seed
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * (1 << 20))) if prefix_cache_mb > 0 else None
        self._requests_submitted = 0  # with ``seed``, determines every request's sampling stream
        self._tokenizer: Any = None  # loaded for the first request with ``stop`` strings
        self._tokenizer_lock = threading.Lock()  # requests are tokenized on the caller's thread, decoded on ours
        # Model compute so far (prefills, decode steps, sampling), for the step breakdown.
        self.busy_seconds: float = 0.0
        self.sampled_tokens = 0  # tokens sampled so far over every request (see wait_for_sampled_tokens)
        self._progress = threading.Condition()
        self._waiting: queue.Queue[_Request | None] = queue.Queue()
        self._step_lock = threading.Lock()  # held for each model step and for each weight update
        self._paused = False  # a weight update is in progress: no model step starts (begin/end_weight_update)
        self._pause = threading.Condition()
        self._gate: AdmissionGate | None = None  # the rollout whose requests were admitted last (scheduler thread)
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name="TransformersEngine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API (SGLang's names)

    async def async_generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        return_logprob: bool = False,
        **kwargs: Any,
    ) -> GenerateResult | list[GenerateResult]:
        """Generate for one prompt (a list of ids) or a batch (a list of lists), like ``sglang.Engine``."""
        futures, batched = self._submit(input_ids, sampling_params, return_logprob, kwargs)
        results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        return list(results) if batched else results[0]

    def generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        return_logprob: bool = False,
        **kwargs: Any,
    ) -> GenerateResult | list[GenerateResult]:
        """Blocking twin of :meth:`async_generate`."""
        futures, batched = self._submit(input_ids, sampling_params, return_logprob, kwargs)
        results = [f.result() for f in futures]
        return results if batched else results[0]

    def submit_with_stream(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any] | None,
        return_logprob: bool,
        image_data: Any,
        stream: Hashable,
    ) -> concurrent.futures.Future:
        """One request (``n`` must be 1) sampled from the stream ``stream`` names, rather than from its trajectory
        and turn: for an engine process (:mod:`~lit_agentrl.engines.process`) whose caller keys the streams."""
        futures, _ = self._submit(input_ids, sampling_params, return_logprob, {"image_data": image_data}, stream)
        if len(futures) != 1:
            raise ValueError(f"submit_with_stream takes one request, got {len(futures)} (n > 1?)")
        return futures[0]

    def update_weights_from_tensor(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> tuple[bool, str]:
        """Copy ``(name, tensor)`` pairs into the engine's weights between decode steps.

        Names are the Hugging Face state-dict names. Returns ``(False, message)`` on an unknown name or
        a shape mismatch, having applied nothing, as SGLang reports failures.
        """
        if load_format not in (None, "direct"):
            return False, f"load_format {load_format!r} is not supported by TransformersEngine (use None)"
        targets = self.model.state_dict(keep_vars=True)  # every name, tied aliases included (lm_head.weight)
        pairs = list(named_tensors)
        problem = check_named_tensors(pairs, {name: tuple(t.shape) for name, t in targets.items()})
        if problem:
            return False, problem
        with self._step_lock, torch.no_grad():
            for name, tensor in pairs:
                targets[name].copy_(tensor.to(device=self.device, dtype=targets[name].dtype))
            if flush_cache and self.prefix_cache is not None:
                self.prefix_cache.clear()
        return True, f"updated {len(pairs)} tensors"

    def begin_weight_update(self) -> None:
        """Hold model steps from the one in progress until :meth:`end_weight_update`: requests in flight (rollouts
        running beside the trainer) continue on the new weights, never on a half-updated mix."""
        with self._pause:
            self._paused = True
        with self._step_lock:  # the step in progress, if any, finishes first
            pass

    def end_weight_update(self) -> None:
        with self._pause:
            self._paused = False
            self._pause.notify_all()

    def wait_for_sampled_tokens(self, count: int, timeout: float | None = None) -> bool:
        """Block until the engine has sampled ``count`` tokens in all since it started (False: timed out, or shut
        down first): something to act on while requests are decoding is an event, never a sleep."""
        with self._progress:
            self._progress.wait_for(lambda: self.sampled_tokens >= count or self._stopped, timeout)
            return self.sampled_tokens >= count

    def get_weights_by_name(self, name: str) -> torch.Tensor:
        """A copy of one weight, by its state-dict name (SGLang offers the same for tests)."""
        with self._step_lock:
            return self.model.get_parameter(name).detach().clone()

    def reseed(self, seed: int) -> None:
        """Restart the sampling streams: the n-th request submitted from now on samples from (seed, n)."""
        self.seed, self._requests_submitted = seed, 0

    def flush_cache(self) -> bool:
        """Drop every kept prefix (their KV was computed by the weights before an update)."""
        if self.prefix_cache is not None:
            with self._step_lock:
                self.prefix_cache.clear()
        return True

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Move the weights off the accelerator while the trainer needs the memory; a no-op on CPU."""
        if self.device.type != "cpu":
            with self._step_lock:
                self.model.to("cpu")

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Bring the weights back after :meth:`release_memory_occupation`."""
        if self.device.type != "cpu":
            with self._step_lock:
                self.model.to(self.device)

    def shutdown(self) -> None:
        """Stop the scheduler thread; queued requests fail with ``RuntimeError``."""
        if self._stopped:
            return
        self._stopped = True
        self.end_weight_update()
        with self._progress:
            self._progress.notify_all()
        self._waiting.put(None)
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------ request intake

    def _submit(
        self,
        input_ids: list[int] | list[list[int]] | None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None,
        return_logprob: bool,
        extra: dict[str, Any],
        stream: Hashable | None = None,
    ) -> tuple[list[concurrent.futures.Future], bool]:
        if self._stopped:
            raise RuntimeError("TransformersEngine has been shut down")
        extra = dict(extra)
        image_data = extra.pop("image_data", None)
        unsupported = sorted(k for k, v in extra.items() if v is not None)
        if unsupported:
            raise ValueError(f"TransformersEngine.async_generate: unsupported argument(s) {unsupported}")
        if not input_ids:
            raise ValueError("async_generate needs input_ids (a non-empty list of token ids, or a list of them)")
        batched = isinstance(input_ids[0], list)
        prompts = cast("list[list[int]]", input_ids if batched else [input_ids])
        params_list = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} sampling_params")
        images_list = image_data if batched and image_data is not None else [image_data] * len(prompts)
        if len(images_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(images_list)} image_data entries")
        checked = []
        for prompt, raw, images in zip(prompts, params_list, images_list):
            params = SamplingParams.from_dict(raw)
            if not prompt:
                raise ValueError("async_generate: a prompt has no tokens")
            checked.append((prompt, params, self._stop_window(params), self._prepare_images(prompt, images)))
        futures = []
        for prompt, params, window, prepared in checked:
            for _ in range(params.n):
                futures.append(self._enqueue(list(prompt), params, return_logprob, window, prepared, stream))
        return futures, batched or len(futures) > 1

    def _prepare_images(self, prompt: list[int], image_data: Any) -> _Images | None:
        """One prompt's ``image_data`` as the model takes it, checked against the prompt's image tokens."""
        token = self.vision[0] if self.vision is not None else None
        if not image_data:
            if token is not None and token in prompt:
                raise ValueError("async_generate: the prompt holds image tokens but the request has no image_data")
            return None
        if self.vision is None or token is None:
            raise ValueError(
                f"async_generate: image_data given, but the model at {self.model_path!r} has no vision tower"
            )
        if isinstance(image_data, dict):  # processor output, as SGLang's {"format": "processor_output", ...}
            pixel_values, grids = image_data["pixel_values"], image_data["image_grid_thw"]
        else:
            items = image_data if isinstance(image_data, (list, tuple)) else [image_data]
            with self._tokenizer_lock:
                if self._image_processor is None:
                    from lit_agentrl.processors import load_processor

                    self._image_processor = load_processor(self.model_path).image_processor
                out = self._image_processor(images=[load_image(i) for i in items], return_tensors="pt")
            pixel_values, grids = out["pixel_values"], out["image_grid_thw"]
        grids = torch.as_tensor(grids).long().reshape(-1, 3)
        positions, delta = mrope_position_ids(prompt, grids, token, self.vision[1])  # checks tokens against grids
        patches = [int(g.prod()) for g in grids]
        merged = [n // self.vision[1] ** 2 for n in patches]
        spans, start = [], 0
        for count in merged:
            start = prompt.index(token, start)
            spans.append((start, start + count))
            start += count
        offsets = [0, *torch.tensor(patches).cumsum(0).tolist()]
        digests = tuple(image_digest(pixel_values[a:b]) for a, b in itertools.pairwise(offsets))
        return _Images(pixel_values, grids, patches, spans, digests, positions, delta)

    def _stop_window(self, params: SamplingParams) -> int:
        """How many trailing output tokens to decode for ``params.stop`` (0 without stop strings)."""
        if not params.stop:
            return 0
        with self._tokenizer_lock:
            if self._tokenizer is None:
                try:  # as SGLang loads it (sglang/srt/utils/hf_transformers/tokenizer.py get_tokenizer)
                    tokenizer = AutoTokenizer.from_pretrained(self.model_path, clean_up_tokenization_spaces=False)
                    if len(tokenizer) <= 1:  # transformers 5 builds an empty one where there are no tokenizer files
                        raise ValueError("no tokenizer files there")
                except (OSError, ValueError) as exc:
                    raise UserInputError(
                        f"sampling_params.stop: matching stop strings needs the model's tokenizer, and none loads from "
                        f"{self.model_path!r} ({exc}); use stop_token_ids"
                    ) from exc
                self._tokenizer = tokenizer
            return params.stop_window(self._tokenizer)

    def _enqueue(
        self,
        prompt: list[int],
        params: SamplingParams,
        return_logprob: bool,
        stop_window: int,
        images: _Images | None = None,
        stream: Hashable | None = None,
    ) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        tag = ROLLOUT_TRAJECTORY.get()
        index = self._requests_submitted
        if stream is None and tag is not None:  # the trajectory's k-th request: the same stream whenever it arrives
            index = tag.gate.next_request_index(tag.key)
            stream = (self.seed if tag.seed is None else tag.seed, *tag.key, index)
        elif stream is None:
            stream = (self.seed, index)
        self._requests_submitted += 1
        if params.sampling_seed is not None:
            stream = params.sampling_seed
        request = _Request(prompt, params, return_logprob, future, random.Random(str(stream)), stop_window, tag)
        request.order = request_order(tag, index)
        request.images = images
        if params.max_new_tokens == 0:
            future.set_result(self._result(request, {"type": "length", "length": 0}))
            return future
        self._waiting.put(request)
        if tag is not None:  # after the put: once the gate is quiescent, every request it counted is queued
            tag.gate.submitted(tag.key)
        return future

    # ------------------------------------------------------------------ scheduler thread

    def _serve(self) -> None:
        batch: RunningBatch[_Request] = RunningBatch()
        pending: collections.deque[_Request] = collections.deque()
        admission_point = True  # idle, or requests finished in the last step (deterministic mode admits only then)
        while self._drain_queue(pending, block=not (batch.requests or pending)):
            admitted = self._admit(pending, len(batch.requests), admission_point)
            with self._pause:  # a weight update in progress: the next step waits for all of it
                self._pause.wait_for(lambda: not self._paused or self._stopped)
            finished = 0
            try:
                with self._step_lock, torch.inference_mode():
                    start = time.perf_counter()
                    if admitted:
                        finished += self._prefill(batch, admitted)
                    if batch.requests:
                        finished += self._decode(batch)
                    self.busy_seconds += time.perf_counter() - start
            except Exception as exc:  # a model error fails the requests in flight, never the thread
                log.exception("TransformersEngine step failed")
                for request in batch.requests + admitted:
                    if not request.future.done():
                        _deliver(request, error=exc)
                batch, finished = RunningBatch(), 1
            admission_point = finished > 0 or not batch.requests
        stopped = RuntimeError("TransformersEngine has been shut down")
        for request in [*batch.requests, *pending]:
            _deliver(request, error=stopped)
        while not self._waiting.empty():
            item = self._waiting.get_nowait()
            if item is not None:
                _deliver(item, error=stopped)

    def _admit(self, pending: collections.deque[_Request], running: int, admission_point: bool) -> list[_Request]:
        """The pending requests that join the running batch now (as many as there is room for).

        Deterministic mode admits only at admission points, once every running trajectory of the rollouts the
        requests come from waits on the engine, and then in trajectory order: so which requests share a step does
        not depend on when they arrived.
        """
        if self.deterministic:
            if not admission_point:
                return []
            gates = {r.tag.gate for r in pending if r.tag is not None}
            if self._gate is not None and not self._gate.finished:
                gates.add(self._gate)
            for gate in gates:
                if not self._wait_quiescent(gate):
                    return []
            if gates:
                self._drain_queue(pending, block=False)
            ordered = sorted(pending, key=lambda r: r.order)
            pending.clear()
            pending.extend(ordered)
        room = self.max_running_requests - running
        admitted = [pending.popleft() for _ in range(min(room, len(pending)))]
        self._gate = next((r.tag.gate for r in reversed(admitted) if r.tag is not None), self._gate)
        return admitted

    def _wait_quiescent(self, gate: AdmissionGate) -> bool:
        """Wait until the gate is quiescent; False when the engine shuts down meanwhile."""
        while not gate.wait_quiescent(timeout=0.1):
            if self._stopped:
                return False
        return True

    def _drain_queue(self, pending: collections.deque[_Request], block: bool) -> bool:
        """Move queued requests into ``pending``; False once shut down.

        When idle (``block``), wait for a first request, then keep gathering while requests keep arriving
        within ``admission_window_s``: agents submit their requests one by one, and one prefill over many
        of them costs far less than many prefills over few.
        """
        deadline = None
        try:
            item = self._waiting.get(block=block)
            while True:
                if item is None:  # shut down; put back, so that every later drain sees it too (one in _admit may
                    self._waiting.put(None)  # take it first, and the loop's next, blocking drain must not wait)
                    return False
                pending.append(item)
                if block and deadline is None:
                    deadline = time.monotonic() + self.max_admission_wait_s
                wait = min(self.admission_window_s, deadline - time.monotonic()) if deadline else 0.0
                item = self._waiting.get(timeout=wait) if wait > 0 else self._waiting.get_nowait()
        except queue.Empty:
            return True

    def _prefill(self, batch: RunningBatch[_Request], admitted: list[_Request]) -> int:
        """Prefill the admitted prompts into the running batch: each distinct prompt once, after its cached prefix."""
        for request in admitted:
            self._note_version(request)
        distinct: dict[tuple[tuple[str, ...], tuple[int, ...]], int] = {}
        firsts: list[_Request] = []  # one request per distinct prompt (and images)
        rows = []
        for r in admitted:
            key = (r.scope, tuple(r.input_ids))
            if key not in distinct:
                distinct[key] = len(distinct)
                firsts.append(r)
            rows.append(distinct[key])
        prompts = [list(ids) for _, ids in distinct]
        cached = [
            self.prefix_cache.pop_longest_prefix(r.input_ids, r.scope) if self.prefix_cache is not None else None
            for r in firsts
        ]
        if self.vision is None:
            cache, mask, logits = self._forward_prompts(prompts, cached)
        else:
            cached = [_whole_images(c, r.images) for c, r in zip(cached, firsts)]
            cache, mask, logits = self._forward_prompts(prompts, cached, [r.images for r in firsts])
        if len(prompts) < len(admitted):  # copies of one prompt share its prefill
            index = torch.tensor(rows, device=self.device)
            select_rows(cache, index)
            mask, logits = mask.index_select(0, index), logits.index_select(0, index)
        batch.merge(admitted, cache, mask)
        return self._sample_and_finish(
            batch, logits, rows=range(len(batch.requests) - len(admitted), len(batch.requests))
        )

    def _forward_prompts(
        self,
        prompts: list[list[int]],
        cached: list[CachedPrefix | None],
        images: list[_Images | None] | None = None,
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """One forward over the prompts' uncached tokens; returns the KV cache, its mask and last logits.

        Row layout: [padding, cached prefix | padding, new tokens], the cached part left-padded to the longest
        prefix and the new part to the longest remainder; padding is masked out, positions count real tokens.
        ``images`` (a vision-language model's, one entry per prompt): 3-D positions, and the pixel values of the
        images among each row's new tokens.
        """
        past = max((c.length for c in cached if c is not None), default=0)
        news = [p[c.length :] if c is not None else p for p, c in zip(prompts, cached)]
        width = max(map(len, news))
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        # M-RoPE positions are [3, B, W] (a text row's three components are equal); plain ones [B, W].
        components = () if images is None else (3,)
        positions = torch.zeros((*components, len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), past + width), dtype=torch.long)
        pixels: list[torch.Tensor] = []
        grids: list[torch.Tensor] = []
        for row, (prompt, new, hit) in enumerate(zip(prompts, news, cached)):
            reused = hit.length if hit is not None else 0
            ids[row, width - len(new) :] = torch.tensor(new)
            seen = images[row] if images is not None else None
            if seen is None:
                positions[..., row, width - len(new) :] = torch.arange(reused, reused + len(new))
            else:
                positions[:, row, width - len(new) :] = seen.positions[:, reused : len(prompt)]
                offsets = [0, *torch.tensor(seen.patches).cumsum(0).tolist()]
                for k, (start, _) in enumerate(seen.spans):
                    if start >= reused:  # an image in the new tokens (one in the cached part has its KV there)
                        pixels.append(seen.pixel_values[offsets[k] : offsets[k + 1]])
                        grids.append(seen.grids[k])
            mask[row, past - reused : past] = 1
            mask[row, past + width - len(new) :] = 1
        cache = cache_with_prefixes(cached, past)
        mask = mask.to(self.device)
        vision: dict[str, Any] = {}
        if pixels:
            vision = {
                "pixel_values": torch.cat(pixels).to(self.device, self.model.dtype),
                "image_grid_thw": torch.stack(grids).to(self.device),
            }
        logits = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask,
            position_ids=positions.to(self.device),
            **{self._cache_kwarg: cache},
            use_cache=True,
            logits_to_keep=1,
            **vision,
        ).logits[:, -1, :]
        return cache, mask, logits

    def _decode(self, batch: RunningBatch[_Request]) -> int:
        last = torch.tensor([[r.output_ids[-1]] for r in batch.requests], device=self.device)
        positions = torch.tensor([[r.next_position] for r in batch.requests], device=self.device)
        logits = self.model(
            input_ids=last,
            attention_mask=batch.step_mask(),
            position_ids=positions,
            **{self._cache_kwarg: batch.cache},
            use_cache=True,
        ).logits[:, -1, :]
        return self._sample_and_finish(batch, logits, rows=range(len(batch.requests)))

    def _sample_and_finish(self, batch: RunningBatch[_Request], logits: torch.Tensor, rows: range) -> int:
        """Sample a token for each of ``rows``; finished requests get their results and leave the batch. Returns
        how many finished."""
        requests = [batch.requests[i] for i in rows]
        uniforms = torch.tensor([r.rng.random() for r in requests], device=logits.device)
        counts = self._generated_counts(requests, logits)
        tokens, logprobs = sample_tokens(logits.float(), [r.params for r in requests], uniforms, counts)
        finished: list[tuple[int, _Request, dict[str, Any]]] = []
        for row, request, token, logprob in zip(rows, requests, tokens.tolist(), logprobs.tolist()):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            if request.counts is not None:
                request.counts[token] += 1
            reason = self._finish_reason(request, token)
            if reason is not None:
                finished.append((row, request, reason))
        with self._progress:
            self.sampled_tokens += len(requests)
            self._progress.notify_all()
        if not finished:
            return 0
        if self.prefix_cache is not None:  # every token fed so far: the prompt and all but the last output
            for row, request, _ in finished:
                self.prefix_cache.store(request.input_ids + request.output_ids[:-1], batch.row_kv(row), request.scope)
        batch.drop([row for row, _, _ in finished])
        # Results go out last: each wakes an agent on the event loop, whose Python would then contend for the GIL
        # with this thread's many small tensor operations (measured: 1 s of a 1.9 s multi-turn rollout).
        for _, request, reason in finished:
            request.counts = None
            self._note_version(request)
            _deliver(request, self._result(request, reason))
        return len(finished)

    def _note_version(self, request: _Request) -> None:
        """Record the weights' version on the request's trajectory (at admission and at its last token)."""
        if request.tag is not None:
            request.tag.gate.note_version(request.tag.key, self.weight_version)

    @staticmethod
    def _generated_counts(requests: list[_Request], logits: torch.Tensor) -> torch.Tensor | None:
        """[B, V] counts of each row's generated tokens when any row has a penalty (rows without one: zeros), else
        None. Each penalised request keeps its own counts, from its first sampled token on, wherever its row goes.
        """
        penalised = [i for i, r in enumerate(requests) if r.params.penalised]
        if not penalised:
            return None
        counts = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        for i in penalised:
            request = requests[i]
            if request.counts is None:  # first token: nothing generated yet (prompts are not counted)
                request.counts = counts.new_zeros(logits.shape[-1])
            counts[i] = request.counts
        return counts

    def _finish_reason(self, request: _Request, token: int) -> dict[str, Any] | None:
        params = request.params
        # Stop strings come first, ignore_eos or not (schedule_batch.py 2023-2043: strings, then tokens, then length).
        if request.stop_window:
            matched = self._matched_stop_string(request)
            if matched is not None:
                return {"type": "stop", "matched": matched}
        # As in SGLang, ignore_eos turns off every token-based stop, stop_token_ids included.
        if not params.ignore_eos and (token in params.stop_token_ids or token in self.eos_token_ids):
            return {"type": "stop", "matched": token}
        if len(request.output_ids) >= params.max_new_tokens:
            return {"type": "length", "length": len(request.output_ids)}
        return None

    def _matched_stop_string(self, request: _Request) -> str | None:
        """The first of the request's stop strings in its decoded last ``stop_window`` output tokens, if any.

        SGLang's ``Req.tail_str`` / ``_check_str_based_finish`` (``sglang/srt/managers/schedule_batch.py`` 1807-1830,
        1911-1932): the
        window is the longest stop string's length in tokens plus one, so a string spelled by more tokens than its
        own encoding has can be missed, as SGLang misses it; an empty string matches at once.
        """
        with self._tokenizer_lock:
            tail = self._tokenizer.decode(request.output_ids[-request.stop_window :])
        return next((s for s in request.params.stop if s in tail), None)

    def _result(self, request: _Request, finish_reason: dict[str, Any]) -> GenerateResult:
        meta: dict[str, Any] = {
            "finish_reason": finish_reason,
            "prompt_tokens": len(request.input_ids),
            "completion_tokens": len(request.output_ids),
            "weight_version": self.weight_version,  # at the last token, as SGLang reports it
        }
        if request.return_logprob:
            meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(request.logprobs, request.output_ids)]
        return {"output_ids": list(request.output_ids), "meta_info": meta}


def _whole_images(hit: CachedPrefix | None, images: _Images | None) -> CachedPrefix | None:
    """``hit``, unless it ends inside an image's tokens (an image is encoded whole, never in part): then None."""
    if hit is None or images is None:
        return hit
    if any(start < hit.length < end for start, end in images.spans):
        return None
    return hit


def _deliver(request: _Request, result: GenerateResult | None = None, error: BaseException | None = None) -> None:
    """Hand a request its answer; its trajectory counts as running again first (see engines.admission)."""
    if request.tag is not None:
        request.tag.gate.answered(request.tag.key)
    if request.future.done():  # cancelled by its caller (a trajectory's timeout)
        return
    if error is not None:
        request.future.set_exception(error)
    else:
        request.future.set_result(result)
