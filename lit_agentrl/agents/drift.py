"""Template drift: do the accumulated token ids equal the whole conversation rendered by the chat template?

Multi-turn rollouts build ids turn by turn; the trainer then learns from them as one sequence. If the
template renders the finished conversation differently (a dropped newline after the end-of-turn token,
reasoning blocks stripped from earlier turns, a default system prompt, tool results grouped differently),
the policy trains on a sequence it will never see at inference. This check re-renders the conversation
at once, splices in each model turn's generated ids verbatim (generated tokens are never re-tokenized),
and counts the positions where the two sequences differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages

from lit_agentrl.agents.chat_model import find_last_ai_index
from lit_agentrl.agents.multimodal import (
    MULTI_MODAL_FIELD,
    VisionInputs,
    first_image_message,
    template_messages,
    tokenizer_of,
    widen,
)

_MARKER = "\u2063LITAGENTRL_GEN_{}\u2063"


def expected_token_ids(
    messages: Sequence[BaseMessage],
    tokenizer: Any,
    tools: list[dict] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    processor: Any = None,
) -> list[int]:
    """The conversation up to its last model turn as the template renders it, generated ids spliced in.

    A conversation with images renders through ``processor`` (its chat template, each image's placeholder widened
    to the image's tokens by the grids the last model turn recorded).
    """
    last_ai = find_last_ai_index(messages)
    if last_ai < 0:
        raise ValueError("template drift needs a conversation with at least one model turn")
    history = list(messages[: last_ai + 1])
    rendered: list[dict] = []
    generated: list[list[int]] = []
    images = processor is not None and first_image_message(history) is not None
    for message in history:
        if isinstance(message, AIMessage):
            rendered.append({"role": "assistant", "content": _MARKER.format(len(generated))})
            generated.append(list(message.response_metadata["output_ids"]))
        elif images:
            rendered.extend(template_messages([message])[0])
        else:
            rendered.extend(convert_to_openai_messages([message]))
    kwargs = {"tools": tools, "tokenize": False, "add_generation_prompt": False, **(chat_template_kwargs or {})}
    if images:
        text = processor.apply_chat_template(rendered, **kwargs)
        grids = history[last_ai].response_metadata.get(MULTI_MODAL_FIELD, {}).get("image_grid_thw")
        text = widen(processor, text, VisionInputs(image_grid_thw=grids))
        tokenizer = tokenizer_of(processor)
    else:
        text = tokenizer.apply_chat_template(rendered, **kwargs)
    return _spliced(text, generated, tokenizer)


def _spliced(text: str, generated: list[list[int]], tokenizer: Any) -> list[int]:
    """``text``'s ids with each model turn's marker replaced by the ids it generated, verbatim."""
    ids: list[int] = []
    for turn, output_ids in enumerate(generated):
        before, text = text.split(_MARKER.format(turn), 1)
        segment = tokenizer.encode(before, add_special_tokens=False)
        if ids and segment and ids[-1] == segment[0]:  # the end-of-turn token the model generated itself
            segment = segment[1:]
        ids += segment + output_ids
    return ids


def count_openai_drift(
    messages: Sequence[dict[str, Any]],
    generated: Sequence[int],
    outputs: list[list[int]],
    token_ids: list[int],
    tokenizer: Any,
    tools: list[dict] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> int:
    """:func:`count_template_drift` of a conversation of OpenAI-style dicts (the gateway's): ``generated`` are the
    indices of the model's replies in ``messages``, ``outputs`` their generated ids, ``token_ids`` the ids
    accumulated up to the last reply."""
    if not outputs:
        raise ValueError("template drift needs a conversation with at least one model turn")
    positions = list(generated)
    last = positions[-1]
    rendered = [
        {"role": "assistant", "content": _MARKER.format(positions.index(i))} if i in positions else dict(m)
        for i, m in enumerate(messages[: last + 1])
    ]
    kwargs = {"tools": tools, "tokenize": False, "add_generation_prompt": False, **(chat_template_kwargs or {})}
    expected = _spliced(tokenizer.apply_chat_template(rendered, **kwargs), outputs, tokenizer)
    return sum(a != b for a, b in zip(token_ids, expected, strict=False)) + abs(len(token_ids) - len(expected))


def count_template_drift(
    messages: Sequence[BaseMessage],
    tokenizer: Any,
    tools: list[dict] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    processor: Any = None,
) -> int:
    """Positions where the last model turn's accumulated ``token_ids`` differ from the re-rendered ones.

    0 means token-exact agreement with the template; the length difference counts as mismatches too.
    """
    last_ai = find_last_ai_index(messages)
    if last_ai < 0:
        raise ValueError("template drift needs a conversation with at least one model turn")
    actual = list(messages[last_ai].response_metadata["token_ids"])
    expected = expected_token_ids(messages, tokenizer, tools, chat_template_kwargs, processor)
    return sum(a != b for a, b in zip(actual, expected, strict=False)) + abs(len(actual) - len(expected))
