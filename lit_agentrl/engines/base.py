"""The rollout engine contract: SGLang's ``Engine`` API, token in / token out, as one base class.

Agents, the chat model and the rollout manager only ever talk to :class:`RolloutEngine`, so the real SGLang
engine drops in unchanged and the transformers engine imitates it. One generation result looks like::

    {
        "output_ids": [int, ...],                 # generated tokens, the stop/EOS token included
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": int | str} | {"type": "length", "length": int}
                             | {"type": "abort", "message": str},
            "prompt_tokens": int,
            "completion_tokens": int,              # == len(output_ids)
            "output_token_logprobs": [(logprob, token_id, None), ...],   # only with return_logprob=True
        },
    }

Every member the trainer uses is declared here, so an engine states what it does by overriding, and the
trainer never probes with ``hasattr``. Only generation and weight updates are abstract: everything else has
a default that is right for an engine without that feature.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from lit_agentrl.engines.placement import EnginePlacement

if TYPE_CHECKING:
    from lit_agentrl.config.training import Lora

GenerateResult = dict[str, Any]


class PromptTooLongError(ValueError):
    """A request that does not fit the engine's context (:attr:`RolloutEngine.context_length`), refused before it
    reaches the engine, as SGLang 0.5.23's tokenizer manager refuses it (``_validate_one_request``): a prompt of
    ``context_length`` tokens or more, or an explicit ``max_new_tokens`` that would take prompt and output past it."""

    def __init__(self, prompt_tokens: int, context_length: int, max_new_tokens: int | None = None) -> None:
        self.prompt_tokens, self.context_length, self.max_new_tokens = prompt_tokens, context_length, max_new_tokens
        if max_new_tokens is None:
            message = (
                f"the prompt has {prompt_tokens} tokens, and the engine's context length is {context_length} tokens: "
                f"a prompt must be shorter than the context length"
            )
        else:
            message = (
                f"the prompt has {prompt_tokens} tokens and max_new_tokens is {max_new_tokens}: "
                f"{prompt_tokens + max_new_tokens} tokens in all, over the engine's context length of "
                f"{context_length} tokens (lower max_new_tokens to {context_length - prompt_tokens} or shorten the prompt)"
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:  # raised in an engine process, re-raised in the caller's
        return type(self), (self.prompt_tokens, self.context_length, self.max_new_tokens)


class RolloutEngine(abc.ABC):
    """What a rollout needs from an inference engine (a subset of ``sglang.Engine``), with defaults.

    Subclass it, implement :meth:`async_generate` and :meth:`update_weights_from_tensor`, and register the
    class with :func:`~lit_agentrl.engines.register_engine` to name it in ``RolloutCallback.engine``.
    """

    shared: bool = False
    """True when other ranks use this engine too (a server): every rank waits for the owner's weight push and memory
    resume before generating, and for the others before the owner releases memory."""

    owner: bool = True
    """Whether this rank pushes the engine's weights and releases and resumes its memory; False on a rank that only
    sends its prompts to an engine another rank owns."""

    loop: asyncio.AbstractEventLoop | None = None
    """The event loop the engine must be driven from (in-process SGLang serves everything from its own); None: any."""

    busy_seconds: float | None = None
    """Model compute so far, for the step-time breakdown; None where the engine cannot count it (SGLang)."""

    context_length: int | None = None
    """The most tokens one request may hold, prompt and generated together; None where unknown. A prompt that does
    not fit is refused with :class:`PromptTooLongError` before it reaches the engine."""

    weight_dtype: torch.dtype | None = None
    """The dtype the engine holds its weights in: :func:`~lit_agentrl.bridge.weights.sync_weights` casts each
    gathered tensor to it before pushing (a bf16 engine gets half the bytes of the fp32 master weights, rounded as its
    own load would round them); None: pushed as the trainer holds them."""

    weight_version: int = 0
    """Training steps in the weights it generates with, set by :func:`~lit_agentrl.bridge.weights.sync_weights`
    inside the update session; trajectories record it (their staleness in ``mode: async``)."""

    generates_beside_trainer: bool = False
    """Whether rollouts may run on it while the trainer trains (``RolloutCallback(mode="async")``): it serves requests
    from any thread's event loop, without the trainer's memory."""

    updates_while_generating: bool = False
    """Whether a weight push may land while requests are in flight (``partial_rollouts``): the update waits for the
    model step in progress and holds the next ones (:meth:`begin_weight_update`), so no token is generated from
    half-updated weights, and the requests continue on the new ones."""

    @classmethod
    def build(
        cls, model_path: str, seed: int = 0, placement: EnginePlacement | None = None, **kwargs: Any
    ) -> list[RolloutEngine]:
        """The engines one config entry asks for; by default one, ``cls(model_path, seed=seed, **kwargs)``.

        Override it when a config describes several engines (``sglang_http``: one client per server URL), or
        when the engine places itself on this rank's devices: ``placement`` says where this rank is (its local
        rank, the ranks per node; None outside a trainer). The default ignores it, as engines that run where
        their ``engine.kwargs`` say (on CPU, or remote servers) should.
        """
        engine_class: Any = cls  # subclasses define the constructor; the base has none to check against
        return [engine_class(model_path, seed=seed, **kwargs)]

    # ------------------------------------------------------------------ required

    @abc.abstractmethod
    async def async_generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None = None,
        return_logprob: bool = False,
        **kwargs: Any,
    ) -> GenerateResult | list[GenerateResult]:
        """Generate for one prompt (a list of ids) or a batch (a list of lists), like ``sglang.Engine``."""

    @abc.abstractmethod
    def update_weights_from_tensor(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> tuple[bool, str]:
        """Copy ``(name, tensor)`` pairs (Hugging Face state-dict names) into the engine's weights.

        Returns ``(False, message)`` without applying anything when a name or shape is wrong (see
        :func:`check_named_tensors`), as SGLang reports failures.
        """

    # ------------------------------------------------------------------ optional, with defaults
    # (doing nothing is the right default for most of them, hence the empty bodies and B027's noqa)

    serves_lora_adapters: bool = False
    """Whether :meth:`load_lora_adapter` works (``model.lora.sync: adapter`` needs it of every engine)."""

    def load_lora_adapter(
        self, named_tensors: list[tuple[str, torch.Tensor]], config: dict[str, Any]
    ) -> tuple[bool, str]:
        """Serve the LoRA adapter ``named_tensors`` (peft's saved names) with ``config`` (its
        ``adapter_config.json``) from now on, replacing the one before; ``(False, message)`` when it cannot."""
        return False, f"{type(self).__name__} does not serve LoRA adapters: set model.lora.sync: merged"

    @classmethod
    def lora_engine_kwargs(cls, lora: Lora, engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``engine.kwargs`` the engine needs to serve ``lora``'s adapters (``model.lora.sync: adapter``), added
        under the user's own ``engine_kwargs`` (which win); none by default."""
        return {}

    def lora_serving_problem(self, lora: Lora) -> str | None:
        """Why this engine, as it runs, cannot serve ``lora``'s adapters (None: it can); asked at setup."""
        return None if self.serves_lora_adapters else f"{type(self).__name__} does not serve LoRA adapters"

    def follow_lora_adapter(self) -> None:  # noqa: B027
        """Another rank loaded the next adapter into this shared engine: serve it to this rank's requests too (an
        engine whose adapter is not named per request has nothing to do)."""

    def begin_weight_update(self) -> None:  # noqa: B027
        """Open a weight-update session around all buckets of one sync (SGLang's); nothing to open by default."""

    def end_weight_update(self) -> None:  # noqa: B027
        """Close the session of :meth:`begin_weight_update`; nothing to close by default."""

    def reseed(self, seed: int) -> None:  # noqa: B027
        """Restart the sampling streams from ``seed``, so a resumed run samples what an unbroken one would.

        The trainer calls it before every rollout with a seed derived from (run seed, rank, step, phase). The
        default does nothing: an engine that cannot restart its streams keeps sampling from them, so its runs
        are reproducible only as far as the engine itself is (SGLang: seeded once, at launch).
        """

    def flush_cache(self) -> bool:
        """Drop cached KV computed by older weights; True on success (nothing cached by default)."""
        return True

    release_drops_weights: bool = False
    """Whether :meth:`release_memory_occupation` loses the weights (to be pushed again after resuming), where the
    default keeps them."""

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:  # noqa: B027
        """Free accelerator memory (``weights``, ``kv_cache``) for a colocated trainer; a no-op by default."""

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:  # noqa: B027
        """Take back the memory of :meth:`release_memory_occupation`; a no-op by default."""

    def shutdown(self) -> None:  # noqa: B027
        """Stop the engine and free what it holds; nothing to stop by default."""


class EngineWrapper(RolloutEngine):
    """An engine that forwards every member to ``inner``: subclass it to count, record or inject faults.

    Example::

        class CountingEngine(EngineWrapper):
            async def async_generate(self, **kwargs):
                self.calls += 1
                return await self.inner.async_generate(**kwargs)
    """

    def __init__(self, inner: RolloutEngine) -> None:
        self.inner = inner

    # Read-only here: the wrapped engine owns these values.
    @property
    def shared(self) -> bool:  # type: ignore[override]
        return self.inner.shared

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:  # type: ignore[override]
        return self.inner.loop

    @property
    def busy_seconds(self) -> float | None:  # type: ignore[override]
        return self.inner.busy_seconds

    @property
    def context_length(self) -> int | None:  # type: ignore[override]
        return self.inner.context_length

    async def async_generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None = None,
        return_logprob: bool = False,
        **kwargs: Any,
    ) -> GenerateResult | list[GenerateResult]:
        return await self.inner.async_generate(
            input_ids=input_ids, sampling_params=sampling_params, return_logprob=return_logprob, **kwargs
        )

    def update_weights_from_tensor(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> tuple[bool, str]:
        return self.inner.update_weights_from_tensor(named_tensors, load_format=load_format, flush_cache=flush_cache)

    @property
    def serves_lora_adapters(self) -> bool:  # type: ignore[override]
        return self.inner.serves_lora_adapters

    def load_lora_adapter(
        self, named_tensors: list[tuple[str, torch.Tensor]], config: dict[str, Any]
    ) -> tuple[bool, str]:
        return self.inner.load_lora_adapter(named_tensors, config)

    def lora_serving_problem(self, lora: Lora) -> str | None:
        return self.inner.lora_serving_problem(lora)

    def follow_lora_adapter(self) -> None:
        self.inner.follow_lora_adapter()

    def begin_weight_update(self) -> None:
        self.inner.begin_weight_update()

    def end_weight_update(self) -> None:
        self.inner.end_weight_update()

    def reseed(self, seed: int) -> None:
        self.inner.reseed(seed)

    def flush_cache(self) -> bool:
        return self.inner.flush_cache()

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.inner.release_memory_occupation(tags)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.inner.resume_memory_occupation(tags)

    def shutdown(self) -> None:
        self.inner.shutdown()


def expected_weight_shapes(model_path: str) -> dict[str, tuple[int, ...]]:
    """State-dict names and shapes of the model at ``model_path`` as the policy builds it (a causal LM, or a
    vision-language model with its vision tower), on the meta device (no memory)."""
    from lit_agentrl.models.skeleton import empty_model

    return {name: tuple(t.shape) for name, t in empty_model(model_path).state_dict().items()}


def check_named_tensors(pairs: list[tuple[str, torch.Tensor]], shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why ``pairs`` must not be applied, or None: every engine refuses a whole bucket before touching a weight.

    SGLang would ignore an unknown name and die on a wrong shape; the transformers engine would half-apply.
    """
    for name, tensor in pairs:
        if name not in shapes:
            return f"unknown weight {name!r}; the engine's model has e.g. {sorted(shapes)[:5]}"
        if tuple(tensor.shape) != tuple(shapes[name]):
            return f"weight {name!r}: shape {tuple(tensor.shape)} != {tuple(shapes[name])}"
    return None


def output_logprobs(result: GenerateResult) -> list[float]:
    """The per-token log-probabilities of ``result``'s generated tokens, in order."""
    return [float(entry[0]) for entry in result["meta_info"].get("output_token_logprobs") or []]
