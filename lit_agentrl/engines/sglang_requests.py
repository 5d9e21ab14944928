"""The SGLang engines' requests as they leave for SGLang: checked at the engines' front door
(:mod:`~lit_agentrl.engines.requests`), one request per sample, each with a request id and a sampling seed of ours.

* **Request ids** (SGLang's ``rid``): a call that is cancelled (a trajectory's timeout) or fails aborts exactly its
  own requests in SGLang (``TokenizerManager.abort_request(rid)``, or the server's ``/abort_request``); without that,
  SGLang computes an abandoned request to its end. SGLang gives the samples of ``n > 1`` ids of its own, so ``n`` is
  expanded here into single requests, as the transformers engines expand it.
* **Sampling seeds** (SGLang's per-request ``sampling_seed``): each request's is derived from its sampling stream,
  keyed as the transformers engines key theirs (:class:`~lit_agentrl.engines.requests.StreamKeys`: the rollout's
  seed, the trajectory and its request count; outside a rollout, the engine's seed and the request count since the
  last reseed), so a repeated rollout sends the same seeds and two turns of a trajectory never share one. A
  ``sampling_seed`` in the request's own parameters wins. SGLang 0.5.23 samples from it only when started with
  ``enable_deterministic_inference`` (``sampling/sampling_batch_info.py``: the seeds are read only in that mode), which
  its CPU backend cannot run (it takes only the fa3, fa4, flashinfer, triton, ascend and intel_xpu attention
  backends); the engines say so once when reseeded without it (:func:`warn_unseeded`).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from lit_agentrl.context import current_tag
from lit_agentrl.engines.requests import StreamKeys, joined_requests, split_requests

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SGLangCall:
    """One ``generate`` call for SGLang: its arguments, and the ids of its requests (to abort them)."""

    kwargs: dict[str, Any]
    rids: list[str]


def sglang_call(
    engine: str,
    input_ids: Any,
    sampling_params: Any,
    kwargs: dict[str, Any],
    streams: StreamKeys,
    context_length: int | None,
    image_token_id: int | None,
) -> SGLangCall:
    """SGLang's ``generate`` arguments for one call: checked (context length, no stop strings: SGLang runs without a
    tokenizer), ``n`` expanded, each request with its ``rid`` and ``sampling_seed``; ``kwargs``: the call's other
    arguments (``image_data``, and any SGLang takes), passed on."""
    kwargs = dict(kwargs)
    if kwargs.get("rid") is not None:
        raise ValueError(f"{engine}.async_generate: rid is set by the engine (it aborts its requests by their ids)")
    kwargs.pop("rid", None)
    image_data = kwargs.pop("image_data", None)
    requests, batched = split_requests(engine, input_ids, sampling_params, {"image_data": image_data}, context_length)
    tag = current_tag()
    samples = []
    for request in requests:
        request.params.check_without_tokenizer("sglang")
        params = {key: value for key, value in request.sampling_params.items() if key != "n"}  # the wire form
        for _ in range(request.params.n):
            stream, _ = streams.next(tag)
            own = params if params.get("sampling_seed") is not None else {**params, "sampling_seed": seed_of(stream)}
            samples.append((request, own))
    batched = batched or len(samples) > 1
    call = joined_requests(samples, batched)
    if call["image_data"] is None:
        del call["image_data"]
    else:
        call["input_ids"] = one_placeholder_per_image(call["input_ids"], image_token_id)
    rids = [f"lit-agentrl-{uuid.uuid4().hex}" for _ in samples]
    call["rid"] = rids if batched else rids[0]
    return SGLangCall({**call, **kwargs}, rids)


def seed_of(stream: Hashable) -> int:
    """SGLang's ``sampling_seed`` for a sampling stream: 63 bits of a hash of its key, the same in every process."""
    digest = hashlib.blake2b(repr(stream).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def warn_unseeded(where: str, server_args: dict[str, Any]) -> bool:
    """Say (once per engine: the caller keeps the answer) that SGLang at ``where`` ignores the per-request seeds when its
    ``server_args`` lack ``enable_deterministic_inference`` (``rl_on_policy_target`` turns it on too); True if so."""
    if server_args.get("enable_deterministic_inference") or server_args.get("rl_on_policy_target"):
        return False
    log.warning(
        "SGLang (%s) runs without enable_deterministic_inference, so it ignores each request's sampling_seed: a "
        "repeated or resumed rollout does not sample the same tokens (set engine.kwargs.enable_deterministic_inference: "
        "true, or start the server with --enable-deterministic-inference; GPU attention backends only)",
        where,
    )
    return True


def one_placeholder_per_image(input_ids: Any, image_token_id: int | None) -> Any:
    """``input_ids`` (one prompt or a batch) with each run of image pads narrowed to one pad, as the chat template
    wrote it; SGLang widens it again to one pad per merged patch of the image in ``image_data``, keeping every
    other token as sent. Sent widened (as :func:`~lit_agentrl.agents.multimodal.encode_multimodal` widens them),
    the pads fail SGLang's check of one placeholder per image and it decodes the prompt and tokenizes the text
    again (``SGLANG_MM_AVOID_RETOKENIZE``'s fallback), which changes any prompt not tokenized canonically.
    """
    if image_token_id is None or not input_ids:
        return input_ids
    if isinstance(input_ids[0], list):
        return [one_placeholder_per_image(ids, image_token_id) for ids in input_ids]
    return [t for k, t in enumerate(input_ids) if t != image_token_id or k == 0 or input_ids[k - 1] != image_token_id]
