"""Images through a real SGLang server: the HTTP engine (and the ChatModel over it) on the tiny Qwen2.5-VL.

What SGLang 0.5.23 does with ``input_ids`` + ``image_data`` (``QwenVLImageProcessor._process_mm_data_uncached``,
``BaseMultimodalProcessor.load_mm_data`` and ``process_and_combine_mm_data``): it decodes the ids, collapses each
``<|vision_start|><|image_pad|>+<|vision_end|>`` to one placeholder, runs the HF processor on that text and the
images, and then (``SGLANG_MM_AVOID_RETOKENIZE``, on by default) rebuilds the prompt from the ids as sent, each
single ``<|image_pad|>`` widened to the image's merged patches. Ids that already hold the widened pads fail that
rebuild ("prompt has N image placeholder token(s) but 1 image(s) were provided") and SGLang keeps its own
re-tokenization of the decoded text instead, which changes a prompt that is not tokenized canonically (a model's
own sampled tokens often are not). The engines therefore send one pad per image
(:func:`~lit_agentrl.engines.sglang_requests.one_placeholder_per_image`); the tests below check the prompt SGLang scores is
token for token ours, and its log-probs are transformers' on our ids.

Run in the SGLang environment, like the other ``sglang`` tests::

    LIT_AGENTRL_REQUIRE_SGLANG=1 SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tests/sglang_shim \\
        /root/.cache/lit-agentrl/sglang-venv/bin/python -m pytest -m sglang -p no:cacheprovider \\
        tests/engines/test_sglang_vision.py
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from support import require_sglang, running_http_engine

pytest.importorskip("PIL")

from langchain_core.messages import HumanMessage
from PIL import Image

from lit_agentrl.engines.sglang_base import as_pair
from lit_agentrl.models.tiny_vl import IMAGE_PAD, TinyVLConfig, save_tiny_vl_model

pytestmark = pytest.mark.sglang

GREEDY = {"max_new_tokens": 4, "temperature": 0.0}


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The byte-level BPE tokenizer: a word has several tokenizations there, which the re-tokenization test needs.
    return save_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl-sglang"), TinyVLConfig())


@pytest.fixture(scope="module")
def vl_engine(vl_dir: Path):
    require_sglang()
    with running_http_engine(vl_dir) as engine:
        yield engine


@pytest.fixture(scope="module")
def processor(vl_dir: Path):
    from lit_agentrl.models.processors import load_processor

    return load_processor(str(vl_dir))


@pytest.fixture(scope="module")
def vl_model(vl_dir: Path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(vl_dir, dtype=torch.float32).eval()


def square(rgb: tuple[int, int, int], size: int = 56) -> Image.Image:
    """A coloured square on white; 56x56 needs no resizing (16 patches, 4 image tokens)."""
    image = Image.new("RGB", (size, size), (255, 255, 255))
    image.paste(Image.new("RGB", (size // 2, size // 2), rgb), (size // 4, size // 4))
    return image


RED, BLUE = square((255, 0, 0)), square((0, 0, 255))


def encode(processor, image: Image.Image, question: str = "what colour is the square?") -> dict:
    """The processor's output for one user turn: ``input_ids`` with the image's pads widened, as the agents send."""
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return processor(text=text, images=[image], return_tensors="pt")


def reference_logprobs(model, pad: int, encoded: dict, prompt: list[int], output: list[int]) -> torch.Tensor:
    """transformers' log-probs of ``output`` after exactly ``prompt`` (with ``encoded``'s image)."""
    ids = torch.tensor([prompt + output])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    inputs |= {"pixel_values": encoded["pixel_values"], "image_grid_thw": encoded["image_grid_thw"]}
    inputs["mm_token_type_ids"] = (ids == pad).int()
    with torch.no_grad():
        logits = model(**inputs).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output).unsqueeze(-1)).squeeze(-1)


def generate(engine, ids: list[int], image: Image.Image, params: dict = GREEDY) -> dict:
    return asyncio.run(
        engine.async_generate(input_ids=ids, sampling_params=params, return_logprob=True, image_data=[image])
    )


def logprobs_of(result: dict) -> torch.Tensor:
    return torch.tensor([entry[0] for entry in result["meta_info"]["output_token_logprobs"]])


def test_an_image_request_matches_transformers(vl_engine, processor, vl_model) -> None:
    encoded = encode(processor, RED)
    ids = encoded["input_ids"][0].tolist()
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert ids.count(pad) == 4  # widened, as encode_multimodal sends them
    result = generate(vl_engine, ids, RED)
    meta = result["meta_info"]
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 4
    assert [entry[1] for entry in meta["output_token_logprobs"]] == result["output_ids"]
    with torch.no_grad():
        expected = vl_model.generate(**encoded, max_new_tokens=4, do_sample=False)[0, len(ids) :].tolist()
    assert result["output_ids"] == expected
    torch.testing.assert_close(
        logprobs_of(result), reference_logprobs(vl_model, pad, encoded, ids, result["output_ids"]), atol=1e-4, rtol=0
    )


def test_the_server_uses_the_pixels(vl_engine, processor, vl_model) -> None:
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    red, blue = encode(processor, RED), encode(processor, BLUE)
    ids = red["input_ids"][0].tolist()
    assert blue["input_ids"][0].tolist() == ids  # same text, same grid: only the pixels differ
    a, b, c = generate(vl_engine, ids, RED), generate(vl_engine, ids, BLUE), generate(vl_engine, ids, RED)
    assert a["output_ids"] == c["output_ids"]
    torch.testing.assert_close(logprobs_of(a), logprobs_of(c), atol=1e-5, rtol=0)
    # The random tiny model may say the same tokens for both, but never with the same log-probs ...
    same = a["output_ids"] == b["output_ids"]
    assert not same or (logprobs_of(a) - logprobs_of(b)).abs().max() > 1e-3
    # ... and each is transformers' for its own image (so neither is the other's, nor an image-less prompt's).
    for result, encoded in ((a, red), (b, blue)):
        expected = reference_logprobs(vl_model, pad, encoded, ids, result["output_ids"])
        torch.testing.assert_close(logprobs_of(result), expected, atol=1e-4, rtol=0)


def test_a_prompt_not_tokenized_canonically_is_scored_as_sent(vl_engine, processor, vl_model) -> None:
    tokenizer = processor.tokenizer
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    encoded = encode(processor, RED)
    ids = encoded["input_ids"][0].tolist()
    # One question token spelled as two tokens that decode to the same text, as a sampled reply may be spelled.
    at = next(k for k, t in enumerate(ids) if t != pad and len(tokenizer.decode([t])) == 2 and _halves(tokenizer, t))
    spelled = ids[:at] + _halves(tokenizer, ids[at]) + ids[at + 1 :]
    assert tokenizer.decode(spelled) == tokenizer.decode(ids) and len(spelled) == len(ids) + 1
    result = generate(vl_engine, spelled, RED)
    # SGLang re-tokenizing the decoded prompt would score ``ids`` (one token fewer), not what was sent.
    assert result["meta_info"]["prompt_tokens"] == len(spelled)
    ours = reference_logprobs(vl_model, pad, encoded, spelled, result["output_ids"])
    canonical = reference_logprobs(vl_model, pad, encoded, ids, result["output_ids"])
    assert (ours - canonical).abs().max() > 1e-4  # the spelling matters to this model
    torch.testing.assert_close(logprobs_of(result), ours, atol=1e-4, rtol=0)


def _halves(tokenizer, token: int) -> list[int]:
    text = tokenizer.decode([token])
    first, second = (tokenizer.encode(part, add_special_tokens=False) for part in (text[:1], text[1:]))
    return first + second if len(first) == 1 and len(second) == 1 else []


def test_a_two_turn_image_conversation_through_the_chat_model(vl_engine, processor, vl_model) -> None:
    from lit_agentrl.agents import ChatModel

    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    model = ChatModel(model="vl", llm=vl_engine, tokenizer=processor.tokenizer, processor=processor)
    sample = {"max_new_tokens": 4, "temperature": 1.0}
    first = HumanMessage(
        content=[{"type": "image", "image": BLUE}, {"type": "text", "text": "what colour is the square?"}]
    )
    reply = asyncio.run(model.ainvoke([first], sampling_params=sample))
    follow = HumanMessage(content="and the background?")
    reply2 = asyncio.run(model.ainvoke([first, reply, follow], sampling_params=sample))
    meta = reply2.response_metadata
    prompt = meta["token_ids"][: len(meta["token_ids"]) - len(meta["output_ids"])]
    assert prompt[: len(reply.response_metadata["token_ids"])] == reply.response_metadata["token_ids"]
    assert prompt.count(pad) == 4
    # The second prompt holds the first reply's sampled tokens as sampled: scored by SGLang exactly as sent.
    encoded = encode(processor, BLUE)
    expected = reference_logprobs(vl_model, pad, encoded, prompt, meta["output_ids"])
    got = torch.tensor(meta["logprobs"][len(prompt) :])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


# ------------------------------------------------------------------ weight pushes into the vision tower

# The trainer's transformers 5 names (``model.language_model.*``, ``model.visual.*``) are not the names SGLang's
# Qwen2.5-VL ``load_weights`` looks up (``model.*``, ``visual.*``, the checkpoint's); the engine checks the policy's
# names, then sends the checkpoint's (:mod:`lit_agentrl.engines.weight_names`). The server runs without SGLang's
# vision embedding cache (``server_env``), which would otherwise keep an image's old encoding across a push.


@pytest.fixture
def sent_names(vl_engine, monkeypatch):
    """The names the engine sends SGLang."""
    push, sent = vl_engine._push, []

    def recorded(pairs, load_format, flush_cache):
        sent.extend(name for name, _ in pairs)
        return push(pairs, load_format, flush_cache)

    monkeypatch.setattr(vl_engine, "_push", recorded)
    return sent


def _policy(vl_dir: Path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(vl_dir, dtype=torch.float32).eval()


def _scale(module: torch.nn.Module, factor: float) -> None:
    with torch.no_grad():
        for param in module.parameters():
            param.mul_(factor)


class _Scorer:
    """Server and transformers log-probs for one image prompt (greedy, 4 tokens)."""

    def __init__(self, engine, processor, image: Image.Image) -> None:
        self.engine, self.image = engine, image
        self.pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        self.encoded = encode(processor, image)
        self.ids = self.encoded["input_ids"][0].tolist()

    def server(self) -> tuple[torch.Tensor, list[int]]:
        result = generate(self.engine, self.ids, self.image)
        return logprobs_of(result), result["output_ids"]

    def reference(self, model, output: list[int]) -> torch.Tensor:
        return reference_logprobs(model, self.pad, self.encoded, self.ids, output)


def _pushed(engine, policy, original):
    """Push ``policy`` with ``sync_weights`` for the ``with`` block, then ``original`` back."""
    from contextlib import contextmanager

    from lit_agentrl.bridge.weights import sync_weights

    @contextmanager
    def pushed():
        try:
            assert sync_weights(policy, [engine]).tensors == len(list(policy.named_parameters()))
            yield
        finally:
            sync_weights(original, [engine])

    return pushed()


def test_a_weight_push_reaches_the_language_model_and_the_vision_tower(
    vl_engine, vl_dir, processor, vl_model, sent_names
) -> None:
    policy = _policy(vl_dir)
    _scale(policy.model.visual.blocks[0], 1.5)
    _scale(policy.model.language_model.layers[1], 1.5)
    scorer = _Scorer(vl_engine, processor, square((0, 160, 0)))
    with _pushed(vl_engine, policy, vl_model):
        got, output = scorer.server()
    assert "visual.blocks.0.mlp.gate_proj.weight" in sent_names
    assert "model.layers.1.self_attn.q_proj.weight" in sent_names
    expected, before = scorer.reference(policy, output), scorer.reference(vl_model, output)
    assert (expected - before).abs().max() > 1e-3  # the perturbation matters to this prompt ...
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)  # ... and the server has all of it


def test_a_vision_only_push_changes_the_server(vl_engine, vl_dir, processor, vl_model) -> None:
    policy = _policy(vl_dir)
    _scale(policy.model.visual.blocks[0], 1.5)
    _scale(policy.model.visual.merger, 0.5)
    scorer = _Scorer(vl_engine, processor, square((200, 100, 0)))
    with _pushed(vl_engine, policy, vl_model):
        got, output = scorer.server()
    before = scorer.reference(vl_model, output)
    assert (got - before).abs().max() > 1e-3  # not the old weights ...
    torch.testing.assert_close(got, scorer.reference(policy, output), atol=1e-4, rtol=0)  # ... the pushed ones


def test_sglang_skips_the_nested_names_it_does_not_know(vl_engine, processor, vl_model) -> None:
    # Why the engine renames: sent as they are (past the engine's translation), names SGLang's loader does not
    # rename are dropped and the push "succeeds"; a stacked projection's nested name (``...q_proj``,
    # ``...gate_proj``) is renamed, not found, and takes the server down with a KeyError (not run here).
    scorer = _Scorer(vl_engine, processor, square((90, 0, 180)))
    names = (
        "model.visual.patch_embed.proj.weight",
        "model.visual.blocks.0.attn.qkv.weight",
        "model.language_model.layers.0.input_layernorm.weight",
        "model.language_model.norm.weight",
    )
    params = dict(vl_model.named_parameters())
    vl_engine.begin_weight_update()
    try:
        ok, message = as_pair(vl_engine._push([(name, params[name].detach() * 3.0) for name in names], None, False))
    finally:
        vl_engine.end_weight_update()
    assert ok, message
    got, output = scorer.server()
    torch.testing.assert_close(got, scorer.reference(vl_model, output), atol=1e-4, rtol=0)  # nothing changed


def test_an_image_seen_before_a_push_is_encoded_by_the_new_vision_tower(vl_engine, vl_dir, processor, vl_model) -> None:
    policy = _policy(vl_dir)
    _scale(policy.model.visual.blocks[0], 1.5)
    _scale(policy.model.visual.merger, 0.5)
    seen = _Scorer(vl_engine, processor, square((0, 120, 200)))
    seen.server()  # with SGLang's vision embedding cache on, this image's old encoding would be kept
    with _pushed(vl_engine, policy, vl_model):
        got, output = seen.server()
    assert (seen.reference(policy, output) - seen.reference(vl_model, output)).abs().max() > 1e-3
    torch.testing.assert_close(got, seen.reference(policy, output), atol=1e-4, rtol=0)
