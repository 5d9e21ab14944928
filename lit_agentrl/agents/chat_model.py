"""A LangChain chat model over a rollout engine that keeps the conversation token-exact.

The first call encodes the prompt with the chat template. Each later call reuses the previous model turn's
token ids as they were generated and appends only the new tool/user messages, encoded as the template
renders them after an assistant turn (a suffix). So the ids the trainer sees are exactly the ids the
engine produced, never re-tokenized from text, and ``response_metadata`` carries the accumulated
``token_ids``, ``loss_mask`` and ``logprobs`` of the whole conversation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.base import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr

from lit_agentrl.agents.multimodal import (
    MULTI_MODAL_FIELD,
    VisionInputs,
    encode_multimodal,
    first_image_message,
    process_images,
    require_processor,
    template_messages,
    tokenizer_of,
    widen,
)
from lit_agentrl.agents.tool_parser import parse_tool_calls
from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.context import current_trajectory
from lit_agentrl.engines.base import output_logprobs
from lit_agentrl.models.processors import image_token_id

_PROMPT_CACHE_SIZE = 4096

# Stands in for an assistant turn's content when rendering the template, to find where that turn's text ends.
_TURN_MARKER = "\u2063LITAGENTRL_TURN\u2063"


def find_first_ai_index(messages: Sequence[Any]) -> int:
    """Index of the first assistant message, or -1."""
    return next((i for i, message in enumerate(messages) if getattr(message, "type", None) == "ai"), -1)


def find_last_ai_index(messages: Sequence[Any]) -> int:
    """Index of the last assistant message, or -1."""
    for i in range(len(messages) - 1, -1, -1):
        if getattr(messages[i], "type", None) == "ai":
            return i
    return -1


class ChatModel(BaseChatModel):
    """LangChain chat model over an engine with SGLang's ``async_generate`` API.

    Args:
        model: a name for the model (``model_name``).
        llm: the rollout engine.
        tokenizer: the policy tokenizer, with a chat template.
        processor: a vision-language policy's processor (:func:`lit_agentrl.models.processors.load_processor`); None for
            text models. Messages with image content are rendered through it (the processor's chat template, the
            image processor, each placeholder widened to the image's tokens: :mod:`~lit_agentrl.agents.multimodal`),
            and the engine gets the images as ``image_data``; without one, an image fails the call with a clear error.
        model_type: ``"vlm"`` or ``"llm"``, for the seed's signature (rendering follows the messages: a turn with
            images goes through the processor whatever this says).
        chat_template_kwargs: extra template variables, e.g. ``{"enable_thinking": False}``.
        max_parallel_calls: keep at most this many tool calls per turn (the seed's default, 1; None keeps all).
            The turn's tokens are kept as generated; only the calls beyond the limit go unanswered.

    ``await model.ainvoke(messages, sampling_params={...})`` returns an ``AIMessage`` with parsed
    ``tool_calls``/``invalid_tool_calls`` and ``response_metadata`` holding ``token_ids``, ``loss_mask``,
    ``logprobs`` (aligned with ``token_ids``), ``prompt_length``, ``output_ids``, ``raw_text``,
    ``finish_reason``, and the ``tools`` and ``chat_template_kwargs`` the turn was rendered with; with images also
    ``multi_modal_inputs`` (``pixel_values``, ``image_grid_thw`` of every image so far) and ``images``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    model_name: str = Field(alias="model")
    llm: Any
    tokenizer: Any
    processor: Any = None
    model_type: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=lambda: {"enable_thinking": False})
    max_parallel_calls: int | None = 1
    _prompt_cache: dict[str, list[int]] = PrivateAttr(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return f"lit-agentrl:{self.model_name}"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (LangChain tools, functions or schemas); ``**kwargs`` parameters are not shown to the model.

        ``tool_choice`` and other keyword arguments are bound along (the chat template does not use them).
        """
        formatted = [convert_to_openai_tool(t) for t in tools]
        for spec in formatted:
            params = spec["function"].get("parameters", {})
            params.get("properties", {}).pop("kwargs", None)
            if "required" in params:
                params["required"] = [r for r in params["required"] if r != "kwargs"]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("ChatModel is async only: use `await model.ainvoke(...)`")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        if stop:
            raise ValueError("ChatModel stops on token ids: pass sampling_params={'stop_token_ids': [...]}, not stop=")
        tools = kwargs.get("tools")
        token_ids, loss_mask, logprobs, prompt_length, vision = self._encode(messages, tools)
        message = await self.generate_turn(
            token_ids, loss_mask, logprobs, prompt_length, tools, self._sampling_params(kwargs), vision
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def generate_turn(
        self,
        token_ids: list[int],
        loss_mask: list[int],
        logprobs: list[float],
        prompt_length: int,
        tools: list[dict] | None,
        sampling_params: Mapping[str, Any],
        vision: VisionInputs | None = None,
    ) -> AIMessage:
        """One model turn after ``token_ids`` (the conversation so far, encoded): the engine's tokens, parsed into
        an ``AIMessage`` whose ``response_metadata`` extends the given lists (also used by the OpenAI gateway)."""
        images = {"image_data": vision.images} if vision is not None and vision.images else {}  # SGLang's name
        output = await self.llm.async_generate(
            input_ids=token_ids, sampling_params=sampling_params, return_logprob=True, **images
        )
        return self._to_message(output, token_ids, loss_mask, logprobs, prompt_length, tools, vision)

    @staticmethod
    def _sampling_params(kwargs: dict[str, Any]) -> SamplingParams:
        """The run's sampling parameters with the call's allowed changes (``SamplingParams.for_call``: a lower
        ``max_new_tokens``, more stop strings or token ids), else the call's outside a rollout: never the engine's
        defaults, which would sample at another temperature or length than the trainer assumes."""
        call = kwargs.get("sampling_params")
        trajectory = current_trajectory()
        run = trajectory.sampling_params if trajectory is not None else None
        if run is not None:
            return SamplingParams.of(run).for_call(call, "ChatModel")
        if call is None:
            raise ValueError(
                "ChatModel.ainvoke was called without sampling_params, outside a rollout that would supply them: pass "
                "sampling_params=config['configurable']['sampling_params'] (the run's) from the graph's node"
            )
        return SamplingParams.of(call, where="ChatModel sampling_params")

    # ------------------------------------------------------------------ encoding

    def _encode(
        self, messages: list[BaseMessage], tools: list[dict] | None
    ) -> tuple[list[int], list[int], list[float], int, VisionInputs]:
        """The engine input for ``messages``: (token_ids, loss_mask, logprobs, prompt_length, images so far)."""
        if not messages:
            raise ValueError("ChatModel got no messages")
        last_ai = find_last_ai_index(messages)
        if last_ai < 0:
            if first_image_message(messages) is not None:  # never render an image as text, or drop it
                ids, vision = encode_multimodal(
                    self.model_name, self.processor, messages, tools, self.chat_template_kwargs
                )
            else:
                ids = self.render_ids(convert_to_openai_messages(messages), tools, add_generation_prompt=True)
                vision = VisionInputs()
            return ids, [0] * len(ids), [0.0] * len(ids), len(ids), vision
        previous = messages[last_ai].response_metadata
        if "token_ids" not in previous:
            raise ValueError("the last assistant message was not produced by ChatModel: it has no token_ids")
        new_messages = messages[last_ai + 1 :]
        if not new_messages:
            raise ValueError("the last message is the model's own turn: append a tool or user message first")
        vision = previous.get("vision") or VisionInputs()
        if first_image_message(new_messages) is not None:  # a later turn brings images of its own
            suffix, new_vision = self._image_suffix(new_messages, tools, previous["output_ids"])
            vision = vision + new_vision
        else:
            suffix = self.encode_suffix(convert_to_openai_messages(new_messages), tools, previous["output_ids"])
        return (
            previous["token_ids"] + suffix,
            previous["loss_mask"] + [0] * len(suffix),
            previous["logprobs"] + [0.0] * len(suffix),
            previous["prompt_length"],
            vision,
        )

    def _image_suffix(
        self, new_messages: list[BaseMessage], tools: list[dict] | None, last_output_ids: list[int]
    ) -> tuple[list[int], VisionInputs]:
        """The suffix ids of a tool/user turn with images (through the processor), and those images."""
        require_processor(self.model_name, self.processor, new_messages)
        rendered, sources = template_messages(new_messages)
        vision = process_images(self.processor, sources)
        context = [{"role": "user", "content": "."}, {"role": "assistant", "content": _TURN_MARKER}]
        text = self.processor.apply_chat_template(
            context + rendered, tools=tools, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )
        suffix_text = widen(self.processor, text[text.rindex(_TURN_MARKER) + len(_TURN_MARKER) :], vision)
        suffix = tokenizer_of(self.processor).encode(suffix_text, add_special_tokens=False)
        return drop_repeated_end(suffix, last_output_ids), vision

    def render_ids(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> list[int]:
        """Token ids of ``messages`` through the chat template (cached: GRPO renders each prompt n times)."""
        key = json.dumps([messages, tools, add_generation_prompt], sort_keys=True, default=str)
        return self._cached(key, lambda: self._render_ids(messages, tools, add_generation_prompt))

    def _cached(self, key: str, render: Callable[[], list[int]]) -> list[int]:
        """A copy of the ids cached under ``key``, rendered on a miss (bounded, oldest evicted first)."""
        cached = self._prompt_cache.get(key)
        if cached is None:
            if len(self._prompt_cache) >= _PROMPT_CACHE_SIZE:
                self._prompt_cache.pop(next(iter(self._prompt_cache)))
            cached = self._prompt_cache[key] = render()
        return list(cached)

    def _render_ids(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.chat_template_kwargs,
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_suffix(
        self, new_messages: list[dict], tools: list[dict] | None, last_output_ids: list[int]
    ) -> list[int]:
        """Ids the template puts after an assistant turn's text when ``new_messages`` follow it.

        The suffix starts with the template's end-of-turn token; when the model already generated it (its
        stop token), it is not repeated. A turn cut by ``max_new_tokens`` gets it from the suffix instead.
        Rendered once per distinct (messages, tools): environments repeat their answers across trajectories.
        """
        key = json.dumps(["suffix", new_messages, tools], sort_keys=True, default=str)
        suffix = self._cached(
            key, lambda: render_turn_suffix(self.tokenizer, new_messages, tools, self.chat_template_kwargs)
        )
        return drop_repeated_end(suffix, last_output_ids)

    # ------------------------------------------------------------------ decoding

    def _to_message(
        self,
        output: dict,
        token_ids: list[int],
        loss_mask: list[int],
        logprobs: list[float],
        prompt_length: int,
        tools: list[dict] | None,
        vision: VisionInputs | None = None,
    ) -> AIMessage:
        meta = output["meta_info"]
        output_ids = list(output["output_ids"])
        completion_tokens = meta.get("completion_tokens", len(output_ids))
        if len(output_ids) != completion_tokens:  # some SGLang releases prepend template tokens to output_ids
            output_ids = output_ids[len(output_ids) - completion_tokens :]
        out_logprobs = output_logprobs(output)
        if len(out_logprobs) != len(output_ids):
            raise ValueError(f"engine returned {len(out_logprobs)} logprobs for {len(output_ids)} tokens")
        finish = meta.get("finish_reason") or {}
        stopped, matched = finish.get("type") == "stop", finish.get("matched")
        # A stop token is not text; a stop string (whose tokens the engine keeps) ends the text where it starts.
        text_ids = output_ids[:-1] if stopped and output_ids and not isinstance(matched, str) else output_ids
        raw_text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        if stopped and isinstance(matched, str) and matched in raw_text:
            raw_text = raw_text[: raw_text.index(matched)]
        parsed = parse_tool_calls(raw_text)
        limit = self.max_parallel_calls
        images: dict[str, Any] = {}
        if vision is not None and vision.images:
            self._check_no_image_token(output_ids)
            images = {MULTI_MODAL_FIELD: vision.model_inputs(), "vision": vision}
        return AIMessage(
            content=parsed.content,
            tool_calls=parsed.tool_calls[:limit],
            invalid_tool_calls=parsed.invalid_tool_calls[:limit],
            response_metadata={
                "token_ids": token_ids + output_ids,
                "loss_mask": loss_mask + [1] * len(output_ids),
                "logprobs": logprobs + out_logprobs,
                "prompt_length": prompt_length,
                "output_ids": output_ids,
                "raw_text": raw_text,
                "finish_reason": finish,
                "tools": tools,
                "chat_template_kwargs": self.chat_template_kwargs,
                **images,
            },
        )

    def _check_no_image_token(self, output_ids: list[int]) -> None:
        """Fail the turn when the model generated the image placeholder itself (an untrained model may): in a
        conversation with images, every placeholder must stand for an image, or neither the engine's next turn nor
        the training forward could place the images."""
        token = image_token_id(self.processor)
        if token in output_ids:
            raise ValueError(
                f"agent {self.model_name!r}: the model generated the image placeholder token (id {token}) in a "
                "conversation with images; the trajectory cannot be trained (its images would not line up)"
            )


def render_turn_suffix(
    tokenizer: Any, new_messages: list[dict], tools: list[dict] | None, chat_template_kwargs: dict[str, Any]
) -> list[int]:
    """Ids the chat template renders after an assistant turn's text when ``new_messages`` follow it."""
    context = [{"role": "user", "content": "."}, {"role": "assistant", "content": _TURN_MARKER}]
    text = tokenizer.apply_chat_template(
        context + list(new_messages), tools=tools, tokenize=False, add_generation_prompt=True, **chat_template_kwargs
    )
    suffix_text = text[text.rindex(_TURN_MARKER) + len(_TURN_MARKER) :]
    return tokenizer.encode(suffix_text, add_special_tokens=False)


def drop_repeated_end(suffix: list[int], last_output_ids: list[int]) -> list[int]:
    """``suffix`` without its first token when the model's turn already ended with it (its stop token)."""
    return suffix[1:] if suffix and last_output_ids and last_output_ids[-1] == suffix[0] else suffix


CustomChatModel = ChatModel
