"""A stop string ends the assistant's text where it starts (the engine keeps its tokens, as SGLang does)."""

from __future__ import annotations

import asyncio

from lit_agentrl.agents.chat_model import ChatModel

PROMPT = [{"role": "user", "content": "count"}]
SAMPLED = {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 3, "ignore_eos": True}  # varied, repeatable


def test_stop_string_cuts_the_text_and_keeps_the_tokens(engine, tokenizer):
    chat = ChatModel(model="m", llm=engine, tokenizer=tokenizer)
    free = asyncio.run(chat.ainvoke(PROMPT, sampling_params=SAMPLED))
    text = free.content
    stop = text[len(text) // 2 :][:3]  # a piece of what the same draws write anyway
    assert stop.strip() and text.index(stop) > 0
    cut = asyncio.run(chat.ainvoke(PROMPT, sampling_params={**SAMPLED, "stop": [stop]}))
    assert cut.response_metadata["finish_reason"] == {"type": "stop", "matched": stop}
    assert cut.content == text[: text.index(stop)]
    assert stop in tokenizer.decode(cut.response_metadata["output_ids"])  # its tokens stay in the trajectory
