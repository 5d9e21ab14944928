"""The engines' one front door: SGLang's ``generate`` arguments split into one request per prompt, each with its
sampling parameters parsed and checked once (:class:`~lit_agentrl.config.sampling.SamplingParams`), so every engine
refuses the same bad request with the same message, and a prompt longer than the engine's context
(:func:`fit_context`). The transformers engines (in-process and in a process of their
own) also key each request's sampling stream here; the SGLang engines join the requests back into SGLang's batch.

A request's stream decides its sampled tokens, so two engines that key streams alike sample alike: a trajectory's
k-th request samples from (rollout seed, key, k) whenever it arrives, whatever runs beside it; an untagged request
from (engine seed, n), the n-th since the last reseed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

import torch

from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.context import TrajectoryTag
from lit_agentrl.engines.base import GenerateResult, PromptTooLongError, RolloutEngine
from lit_agentrl.engines.placement import EnginePlacement


@dataclass(frozen=True)
class PromptRequest:
    """One prompt of a ``generate`` call, with its own sampling parameters and images."""

    prompt: list[int]
    params: SamplingParams
    image_data: Any = None

    @property
    def sampling_params(self) -> dict[str, Any]:
        """Its parameters as SGLang's dict (the wire form an SGLang engine sends)."""
        return self.params.to_request()


def split_requests(
    engine: str,
    input_ids: list[int] | list[list[int]] | None,
    sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None,
    extra: dict[str, Any],
    context_length: int | None = None,
) -> tuple[list[PromptRequest], bool]:
    """SGLang's arguments (one prompt or a batch of them, parameters and ``image_data`` alike) as one request per
    prompt, and whether the caller gets a list back. ``extra``: the call's other keyword arguments, of which only
    ``image_data`` is understood; ``engine`` names the engine in the errors; ``context_length``: the engine's (see
    :func:`fit_context`; None: unchecked)."""
    extra = dict(extra)
    image_data = extra.pop("image_data", None)
    unsupported = sorted(k for k, v in extra.items() if v is not None)
    if unsupported:
        raise ValueError(f"{engine}.async_generate: unsupported argument(s) {unsupported}")
    if not input_ids:
        raise ValueError("async_generate needs input_ids (a non-empty list of token ids, or a list of them)")
    batched = isinstance(input_ids[0], list)
    prompts = cast("list[list[int]]", input_ids if batched else [input_ids])
    params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
    images = image_data if batched and image_data is not None else [image_data] * len(prompts)
    if len(params) != len(prompts) or len(images) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts, {len(params)} sampling_params and {len(images)} image_data")
    if any(not prompt for prompt in prompts):
        raise ValueError("async_generate: a prompt has no tokens")
    where = f"{engine}.async_generate sampling_params"
    requests = [
        PromptRequest(list(p), SamplingParams.of(s, where=where), i) for p, s, i in zip(prompts, params, images)
    ]
    return [fit_context(r, context_length) for r in requests], batched


def fit_context(request: PromptRequest, context_length: int | None) -> PromptRequest:
    """``request`` as SGLang 0.5.23 fits a request to its context (``TokenizerManager._validate_one_request``, then
    ``Scheduler.init_req_max_new_tokens``): a prompt of ``context_length`` tokens or more is refused, and so is an
    explicit ``max_new_tokens`` that takes prompt and output past it (:class:`PromptTooLongError` for both); an unset
    one (SGLang's default, 128) is clipped to the ``context_length - 1`` tokens a request may hold."""
    if context_length is None:
        return request
    length = len(request.prompt)
    if length >= context_length:
        raise PromptTooLongError(length, context_length)
    asked = request.sampling_params.get("max_new_tokens")  # as SGLang would see it: set, or left to its default
    if asked is not None:
        if length + asked > context_length:
            raise PromptTooLongError(length, context_length, asked)
        return request
    room = context_length - 1 - length
    if request.params.max_new_tokens <= room:
        return request
    return replace(request, params=replace(request.params, max_new_tokens=room))


class QueuedEngine(RolloutEngine):
    """An engine whose requests are queued as one future each (:meth:`_submit`): SGLang's ``async_generate`` over them,
    shared by the transformers engine and its engine process, as is where each rank's engine runs (:meth:`build`)."""

    @classmethod
    def build(
        cls, model_path: str, seed: int = 0, placement: EnginePlacement | None = None, **kwargs: Any
    ) -> list[RolloutEngine]:
        """One engine; ``device: cuda`` (no index) becomes the rank's own GPU, ``cuda:<local rank>``."""
        device = kwargs.get("device")
        if placement is not None and device is not None and torch.device(device) == torch.device("cuda"):
            kwargs["device"] = f"cuda:{placement.local_rank}"
        engine_class: Any = cls  # the subclasses define the constructor
        return [engine_class(model_path, seed=seed, **kwargs)]

    def _submit(
        self,
        input_ids: list[int] | list[list[int]] | None,
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None,
        return_logprob: bool,
        extra: dict[str, Any],
    ) -> tuple[list[concurrent.futures.Future], bool]:
        """Queue the call's requests: a future per request, and whether the caller gets a list back."""
        raise NotImplementedError

    async def async_generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None = None,
        return_logprob: bool = False,
        **kwargs: Any,
    ) -> GenerateResult | list[GenerateResult]:
        """Generate for one prompt (a list of ids) or a batch (a list of lists), like ``sglang.Engine``."""
        futures, batched = self._submit(input_ids, sampling_params, return_logprob, kwargs)
        results = await gathered(futures)  # cancelled, it aborts the requests in the engine
        return results if batched else results[0]


async def gathered(futures: list[concurrent.futures.Future]) -> list[Any]:
    """The futures' results, in order. When the wait ends early (the caller's task cancelled: a trajectory's timeout;
    or one request failed), every future is cancelled, which aborts its request where it runs."""
    try:
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
    except BaseException:
        for future in futures:
            future.cancel()
        raise


def joined_requests(requests: list[tuple[PromptRequest, dict[str, Any]]], batched: bool) -> dict[str, Any]:
    """The requests, each with its wire ``sampling_params``, as one SGLang ``generate`` call's ``input_ids``,
    ``sampling_params`` and ``image_data``."""
    if not batched:
        ((one, wire),) = requests
        return {"input_ids": one.prompt, "sampling_params": wire, "image_data": one.image_data}
    images = [r.image_data for r, _ in requests]
    return {
        "input_ids": [r.prompt for r, _ in requests],
        "sampling_params": [wire for _, wire in requests],
        "image_data": images if any(i is not None for i in images) else None,
    }


class StreamKeys:
    """Each request's sampling stream, and its index: the trajectory's request count, or the engine's."""

    def __init__(self, seed: int) -> None:
        self.seed, self.submitted = seed, 0

    def reseed(self, seed: int) -> None:
        """Restart the untagged streams: the n-th request from now on samples from (seed, n)."""
        self.seed, self.submitted = seed, 0

    def next(self, tag: TrajectoryTag | None) -> tuple[Hashable, int]:
        """The next request's stream and index (a tagged one's index is its trajectory's request count)."""
        index = self.submitted
        self.submitted += 1
        if tag is None:
            return (self.seed, index), index
        index = tag.gate.next_request_index(tag.key)
        return (self.seed if tag.seed is None else tag.seed, *tag.key, index), index
