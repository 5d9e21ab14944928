"""A transformers rollout engine that imitates ``sglang.Engine`` in-process (CPU, development, tests).

Requests from any number of coroutines are served by one scheduler thread that keeps a single running
batch with a shared KV cache (continuous batching): new requests are prefilled and merged into the
batch between decode steps, finished rows leave it at once, so they stop costing compute, and the
asyncio loop that runs the agents is never blocked by model compute. Identical prompts admitted together
are prefilled once, and a request that extends a finished one (an agent's next turn) prefills only its new
tokens, from the finished request's KV kept in a :class:`~lit_agentrl.engines.prefix_cache.PrefixCache`.
Each request counts its own generated tokens (for the frequency, presence and repetition penalties) and, when it
has ``stop`` strings, looks for them in its decoded output with the model's tokenizer, loaded on first need.

This module is the API and the requests' intake (images, stop strings, sampling streams); the scheduler thread lives
in :mod:`~lit_agentrl.engines.scheduler`, the running batch and its KV cache in
:mod:`~lit_agentrl.engines.running_batch`, the sampler in :mod:`~lit_agentrl.engines.sampling`.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import itertools
import logging
import random
import threading
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.context import current_tag
from lit_agentrl.engines.admission import request_order
from lit_agentrl.engines.base import GenerateResult, check_named_tensors
from lit_agentrl.engines.prefix_cache import PrefixCache
from lit_agentrl.engines.registry import register_engine
from lit_agentrl.engines.requests import QueuedEngine, StreamKeys, split_requests
from lit_agentrl.engines.scheduler import EngineRequest, RequestImages, Scheduler
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.dtypes import torch_dtype
from lit_agentrl.models.processors import (
    image_digest,
    is_vision_language,
    load_image,
    mrope_position_ids,
    vision_settings,
)

log = logging.getLogger(__name__)


@register_engine("transformers")
class TransformersEngine(QueuedEngine):
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
        context_length: the most tokens a request may hold, prompt and output (None: the model config's
            ``max_position_embeddings``); longer prompts are refused (:func:`~lit_agentrl.engines.requests.fit_context`).

    A request whose caller stops waiting (its task cancelled: a trajectory's timeout) is aborted: it leaves the queue
    or the running batch at the next model step, its KV freed (not kept in the prefix cache: its trajectory has ended).

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
        context_length: int | None = None,
    ) -> None:
        torch_type = torch_dtype(dtype, where="engine.kwargs.dtype")
        if max_running_requests < 1:
            raise UserInputError(f"max_running_requests must be >= 1, got {max_running_requests}")
        if context_length is not None and context_length < 2:
            raise UserInputError(
                f"engine.kwargs.context_length must be >= 2 (a prompt token and one more), got {context_length}"
            )
        self.model_path, self.weight_dtype = model_path, torch_type
        self.device = torch.device(device)
        auto = AutoModelForImageTextToText if is_vision_language(model_path) else AutoModelForCausalLM
        model: Any = auto.from_pretrained(model_path, dtype=torch_type)  # its ``to`` is mistyped
        self.model: Any = model.to(self.device).eval()
        self.vision = vision_settings(self.model)  # (image token id, merge size); None for a text model
        self.context_length = context_length or getattr(
            self.model.config.get_text_config(), "max_position_embeddings", None
        )
        self._image_processor: Any = None  # loaded for the first request with images
        self.model.requires_grad_(False)
        # transformers 5.x renamed ``past_key_values`` to ``cache``; accept either release line.
        forward_args = inspect.signature(self.model.forward).parameters
        cache_kwarg = "cache" if "cache" in forward_args else "past_key_values"
        eos = self.model.generation_config.eos_token_id
        self.eos_token_ids: frozenset[int] = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self.streams = StreamKeys(seed)  # with the trajectory's tag, every request's sampling stream
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * (1 << 20))) if prefix_cache_mb > 0 else None
        self._lora_config: dict[str, Any] | None = None  # the adapter's, once one is served (load_lora_adapter)
        self._lora_params: dict[str, torch.nn.Parameter] = {}  # its layers' weights, by peft's saved names
        self._tokenizer: Any = None  # loaded for the first request with ``stop`` strings
        self._tokenizer_lock = threading.Lock()  # tokenized on the callers' thread, decoded on the scheduler's
        self.scheduler = Scheduler(
            self.model, self.device, cache_kwarg, self.eos_token_ids, self.vision is not None, self.prefix_cache,
            max_running_requests=max_running_requests, deterministic=deterministic,
            admission_window_s=admission_window_s, max_admission_wait_s=max_admission_wait_s,
            weight_version=lambda: self.weight_version, decode=self._decode_tokens,
        )  # fmt: skip

    # ------------------------------------------------------------------ public API (SGLang's names)

    @property
    def busy_seconds(self) -> float:  # type: ignore[override]
        """Model compute so far (prefills, decode steps, sampling), for the step breakdown."""
        return self.scheduler.busy_seconds

    @property
    def sampled_tokens(self) -> int:
        """Tokens sampled so far over every request (see :meth:`wait_for_sampled_tokens`)."""
        return self.scheduler.sampled_tokens

    @property
    def aborted_requests(self) -> int:
        """Requests aborted so far: their callers stopped waiting, and they left the queue or the running batch."""
        return self.scheduler.aborted_requests

    @property
    def running_requests(self) -> int:
        """Requests in the running batch after the last model step."""
        return self.scheduler.running_requests

    @property
    def seed(self) -> int:
        """The seed of the untagged sampling streams (set by :meth:`reseed`)."""
        return self.streams.seed

    def generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None = None,
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
        sampling_params: Mapping[str, Any] | None,
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
        with self.scheduler.step_lock, torch.no_grad():
            for name, tensor in pairs:
                targets[name].copy_(tensor.to(device=self.device, dtype=targets[name].dtype))
            if flush_cache and self.prefix_cache is not None:
                self.prefix_cache.clear()
        return True, f"updated {len(pairs)} tensors"

    serves_lora_adapters = True

    def load_lora_adapter(
        self, named_tensors: list[tuple[str, torch.Tensor]], config: dict[str, Any]
    ) -> tuple[bool, str]:
        """Serve the adapter from now on: peft's layers are injected into the engine's model on the first call (with
        ``config``), then each call copies the adapter's tensors in, between decode steps."""
        from peft import LoraConfig, inject_adapter_in_model

        from lit_agentrl.models.lora_names import adapter_parameter_names

        with self.scheduler.step_lock, torch.no_grad():
            if self._lora_config is None:
                inject_adapter_in_model(LoraConfig(**config), self.model)
                self.model.to(device=self.device, dtype=self.weight_dtype).requires_grad_(False)
                params = dict(self.model.named_parameters())
                self._lora_params = {saved: params[own] for saved, own in adapter_parameter_names(params).items()}
                self._lora_config = config
            elif config != self._lora_config:
                return False, "the adapter's config changed since the first push (rank, alpha or target modules)"
            state = dict(named_tensors)
            if state.keys() != self._lora_params.keys():
                unknown = sorted(state.keys() ^ self._lora_params.keys())[:4]
                return False, f"the adapter's tensors do not match the engine's adapter layers: {unknown}"
            for name, tensor in state.items():
                self._lora_params[name].copy_(tensor)
            if self.prefix_cache is not None:
                self.prefix_cache.clear()
        return True, f"loaded the adapter's {len(state)} tensors"

    def begin_weight_update(self) -> None:
        """Hold model steps from the one in progress until :meth:`end_weight_update`: requests in flight (rollouts
        running beside the trainer) continue on the new weights, never on a half-updated mix."""
        self.scheduler.pause()

    def end_weight_update(self) -> None:
        self.scheduler.resume()

    def wait_for_sampled_tokens(self, count: int, timeout: float | None = None) -> bool:
        """Block until the engine has sampled ``count`` tokens in all since it started (False: timed out, or shut
        down first): something to act on while requests are decoding is an event, never a sleep."""
        return self.scheduler.wait_for_sampled_tokens(count, timeout)

    def wait_for_aborted_requests(self, count: int, timeout: float | None = None) -> bool:
        """Block until ``count`` requests have been aborted in all (False: timed out, or shut down first)."""
        return self.scheduler.wait_for_aborted_requests(count, timeout)

    def get_weights_by_name(self, name: str) -> torch.Tensor:
        """A copy of one weight, by its state-dict name (SGLang offers the same for tests)."""
        with self.scheduler.step_lock:
            return self.model.get_parameter(name).detach().clone()

    def reseed(self, seed: int) -> None:
        """Restart the sampling streams: the n-th request submitted from now on samples from (seed, n)."""
        self.streams.reseed(seed)

    def flush_cache(self) -> bool:
        """Drop every kept prefix (their KV was computed by the weights before an update)."""
        if self.prefix_cache is not None:
            with self.scheduler.step_lock:
                self.prefix_cache.clear()
        return True

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Move the weights off the accelerator while the trainer needs the memory; a no-op on CPU."""
        if self.device.type != "cpu":
            with self.scheduler.step_lock:
                self.model.to("cpu")

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Bring the weights back after :meth:`release_memory_occupation`."""
        if self.device.type != "cpu":
            with self.scheduler.step_lock:
                self.model.to(self.device)

    def shutdown(self) -> None:
        """Stop the scheduler thread; queued requests fail with ``RuntimeError``."""
        self.scheduler.stop()

    # ------------------------------------------------------------------ request intake

    def _submit(
        self,
        input_ids: list[int] | list[list[int]] | None,
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None,
        return_logprob: bool,
        extra: dict[str, Any],
        stream: Hashable | None = None,
    ) -> tuple[list[concurrent.futures.Future], bool]:
        if self.scheduler.stopped:
            raise RuntimeError("TransformersEngine has been shut down")
        requests, batched = split_requests("TransformersEngine", input_ids, sampling_params, extra, self.context_length)
        checked = []
        for request in requests:
            params = request.params
            images = self._prepare_images(request.prompt, request.image_data)
            checked.append((request.prompt, params, self._stop_window(params), images))
        futures = []
        for prompt, params, window, prepared in checked:
            for _ in range(params.n):
                futures.append(self._enqueue(list(prompt), params, return_logprob, window, prepared, stream))
        return futures, batched or len(futures) > 1

    def _prepare_images(self, prompt: list[int], image_data: Any) -> RequestImages | None:
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
                    from lit_agentrl.models.processors import load_processor

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
        return RequestImages(pixel_values, grids, patches, spans, digests, positions, delta)

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
        images: RequestImages | None = None,
        stream: Hashable | None = None,
    ) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        tag = current_tag()
        own_stream, index = self.streams.next(tag if stream is None else None)
        stream = own_stream if stream is None else stream  # given: an engine process's caller keyed it
        if params.sampling_seed is not None:
            stream = params.sampling_seed
        request = EngineRequest(prompt, params, return_logprob, future, random.Random(str(stream)), stop_window, tag)
        request.order = request_order(tag, index)
        request.images = images
        if params.max_new_tokens == 0:
            future.set_result(self.scheduler.result(request, {"type": "length", "length": 0}))
        else:
            self.scheduler.submit(request)
        return future

    def _decode_tokens(self, token_ids: list[int]) -> str:
        """Output tokens as text (the stop strings' window), with the tokenizer :meth:`_stop_window` loaded."""
        with self._tokenizer_lock:
            return str(self._tokenizer.decode(token_ids))
