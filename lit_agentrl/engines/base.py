"""The rollout engine contract: SGLang's ``Engine`` API, token in / token out.

Agents, the chat model and the rollout manager only ever talk to this protocol, so the real SGLang engine
drops in unchanged and the transformers engine imitates it. One generation result looks like::

    {
        "output_ids": [int, ...],                 # generated tokens, the stop/EOS token included
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": int} | {"type": "length", "length": int}
                             | {"type": "abort", "message": str},
            "prompt_tokens": int,
            "completion_tokens": int,              # == len(output_ids)
            "output_token_logprobs": [(logprob, token_id, None), ...],   # only with return_logprob=True
        },
    }

Optional members the trainer uses when an engine has them: ``begin_weight_update()``/``end_weight_update()``
(SGLang's weight-update session, opened once around all buckets of a sync), ``loop`` (the event loop the
engine must be driven from), ``shared`` (True for servers shared by all ranks: rank 0 alone pushes weights)
and ``reseed(seed)`` (restart the sampling streams, for exactly reproducible runs).
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, runtime_checkable

import torch

GenerateResult = dict[str, Any]


@runtime_checkable
class RolloutEngine(Protocol):
    """What a rollout needs from an inference engine (a subset of ``sglang.Engine``)."""

    async def async_generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        return_logprob: bool = False,
        **kwargs: Any,
    ) -> GenerateResult | list[GenerateResult]: ...

    def update_weights_from_tensor(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> tuple[bool, str]: ...

    def flush_cache(self) -> bool: ...

    def release_memory_occupation(self, tags: list[str] | None = None) -> None: ...

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None: ...

    def shutdown(self) -> None: ...


def output_logprobs(result: GenerateResult) -> list[float]:
    """The per-token log-probabilities of ``result``'s generated tokens, in order."""
    return [float(entry[0]) for entry in result["meta_info"].get("output_token_logprobs") or []]
