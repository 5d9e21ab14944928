"""Vision-language agents end to end on a tiny Qwen2.5-VL built locally: processor, ChatModel rendering, the engine,
the training forward and weight sync, and rows with images (the Geometry3K agents: test_geo3k_agents.py).
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
import torch

pytest.importorskip("PIL")

from langchain_core.messages import AIMessage, HumanMessage
from PIL import Image
from transformers import AutoModelForImageTextToText

from lit_agentrl.agents import ChatModel, count_template_drift
from lit_agentrl.agents.multimodal import attach_images
from lit_agentrl.bridge.weights import sync_weights
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.models.processors import ComposedVLProcessor, load_processor, mrope_position_ids, vision_settings
from lit_agentrl.models.tiny_vl import IMAGE_PAD, TinyVLConfig, save_tiny_vl_model
from lit_agentrl.training.batching import collate, prepare_samples
from lit_agentrl.training.loading import shard_units
from lit_agentrl.training.logprobs import model_token_logprobs
from lit_agentrl.types import Trajectory

GREEDY = {"max_new_tokens": 4, "temperature": 0.0}
SAMPLE = {"max_new_tokens": 4, "temperature": 1.0}


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl"), TinyVLConfig(tokenizer="words"))


@pytest.fixture(scope="module")
def processor(vl_dir: Path):
    return load_processor(str(vl_dir))


@pytest.fixture(scope="module")
def vl_model(vl_dir: Path):
    return AutoModelForImageTextToText.from_pretrained(vl_dir).eval()


@pytest.fixture()
def vl_engine(vl_dir: Path):
    engine = TransformersEngine(str(vl_dir), seed=0)
    yield engine
    engine.shutdown()


def square(rgb: tuple[int, int, int], size: int = 56) -> Image.Image:
    image = Image.new("RGB", (size, size), (255, 255, 255))
    image.paste(Image.new("RGB", (size // 2, size // 2), rgb), (size // 4, size // 4))
    return image


def question(image) -> list[HumanMessage]:
    return [
        HumanMessage(
            content=[{"type": "image", "image": image}, {"type": "text", "text": "what colour is the square?"}]
        )
    ]


def independent_ids(
    processor, conversation: list[dict], images: list[Image.Image], generation_prompt: bool
) -> list[int]:
    """What the Qwen2.5-VL processor renders, computed here without the package's helpers."""
    text = processor.tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=generation_prompt
    )
    grids = processor.image_processor(images=images, return_tensors="pt")["image_grid_thw"].tolist()
    pieces = text.split(IMAGE_PAD)
    text = pieces[0] + "".join(IMAGE_PAD * (t * h * w // 4) + rest for (t, h, w), rest in zip(grids, pieces[1:]))
    return processor.tokenizer.encode(text, add_special_tokens=False)


# ------------------------------------------------------------------ processor and positions


def test_the_processor_is_composed_without_torchvision_and_widens_placeholders(processor) -> None:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        assert isinstance(processor, ComposedVLProcessor)
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]
    text = processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    encoded = processor(text=text, images=[square((255, 0, 0), 112)])
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert encoded["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert int((encoded["input_ids"] == pad).sum()) == 16  # 64 patches, merged 2x2


def test_mrope_positions_equal_the_models_own(processor, vl_model) -> None:
    conversation = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}, {"type": "image"}]},
    ]
    text = processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    encoded = processor(text=text, images=[square((255, 0, 0), 112), square((0, 0, 255), 56)])
    ids, grids = encoded["input_ids"], encoded["image_grid_thw"]
    token, merge = vision_settings(vl_model)
    mine, delta = mrope_position_ids(ids[0], grids, token, merge)
    theirs, deltas = vl_model.model.get_rope_index(ids, mm_token_type_ids=(ids == token).int(), image_grid_thw=grids)
    assert torch.equal(mine, theirs[:, 0]) and delta == int(deltas[0])


# ------------------------------------------------------------------ ChatModel and the engine


def test_an_image_turn_is_token_exact_and_has_no_template_drift(processor, vl_engine) -> None:
    image = square((255, 0, 0))
    model = ChatModel(model="vl", llm=vl_engine, tokenizer=processor.tokenizer, processor=processor)
    reply = asyncio.run(model.ainvoke(question(image), sampling_params=SAMPLE))
    meta = reply.response_metadata
    conversation = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what colour is the square?"}]}
    ]
    prompt = independent_ids(processor, conversation, [image], generation_prompt=True)
    assert meta["token_ids"][: meta["prompt_length"]] == prompt
    assert meta["token_ids"][len(prompt) :] == meta["output_ids"]
    assert meta["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    messages = [*question(image), reply]
    assert count_template_drift(messages, processor.tokenizer, processor=processor) == 0

    # A later user turn with an image of its own: appended as the template renders it, images accumulated.
    second = square((0, 0, 255), 112)
    follow = HumanMessage(content=[{"type": "text", "text": "and this?"}, {"type": "image_url", "image_url": second}])
    reply2 = asyncio.run(model.ainvoke([*messages, follow], sampling_params=SAMPLE))
    meta2 = reply2.response_metadata
    assert meta2["token_ids"][: len(meta["token_ids"])] == meta["token_ids"]
    assert meta2["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4], [1, 8, 8]]
    assert count_template_drift([*messages, follow, reply2], processor.tokenizer, processor=processor) == 0


def test_without_a_processor_an_image_fails_loudly(processor, vl_engine) -> None:
    model = ChatModel(model="geo3k_agent", llm=vl_engine, tokenizer=processor.tokenizer)
    with pytest.raises(ValueError, match=r"agent 'geo3k_agent': message 0 .*no processor"):
        asyncio.run(model.ainvoke(question(square((1, 2, 3))), sampling_params=SAMPLE))


def test_the_engine_sees_the_image_and_matches_transformers(processor, vl_engine, vl_model) -> None:
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]
    text = processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    red, blue = square((255, 0, 0)), square((0, 0, 255))
    encoded = processor(text=text, images=[red])
    ids = encoded["input_ids"][0].tolist()
    out = vl_engine.generate(input_ids=ids, sampling_params=GREEDY, return_logprob=True, image_data=[red])
    with torch.no_grad():
        expected = vl_model.generate(**encoded, max_new_tokens=4, do_sample=False)[0, len(ids) :].tolist()
    assert out["output_ids"] == expected[: len(out["output_ids"])]
    # The image reaches the logits: another image, other log-probs for the same tokens.
    forced = {"max_new_tokens": 1, "temperature": 1.0, "sampling_seed": 3}
    a = vl_engine.generate(input_ids=ids, sampling_params=forced, return_logprob=True, image_data=[red])
    b = vl_engine.generate(input_ids=ids, sampling_params=forced, return_logprob=True, image_data=[blue])
    c = vl_engine.generate(input_ids=ids, sampling_params=forced, return_logprob=True, image_data=[red])
    lp = [r["meta_info"]["output_token_logprobs"][0][0] for r in (a, b, c)]
    assert a["output_ids"] == c["output_ids"] and lp[0] == pytest.approx(lp[2], abs=1e-5)
    with pytest.raises(ValueError, match="no image_data"):
        vl_engine.generate(input_ids=ids, sampling_params=GREEDY)


def test_kept_prefixes_are_never_reused_for_other_images(processor, vl_engine) -> None:
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]
    text = processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    red, blue = square((255, 0, 0)), square((0, 0, 255))
    ids = processor(text=text, images=[red])["input_ids"][0].tolist()
    first = vl_engine.generate(input_ids=ids, sampling_params=GREEDY, return_logprob=True, image_data=[red])
    extended = ids + first["output_ids"] + ids[-3:]
    assert vl_engine.prefix_cache is not None
    second = vl_engine.generate(input_ids=extended, sampling_params=GREEDY, image_data=[blue])
    assert vl_engine.prefix_cache.hits == 0  # same ids, another image: no reuse
    third = extended + second["output_ids"] + ids[-3:]
    cached = vl_engine.generate(input_ids=third, sampling_params=GREEDY, return_logprob=True, image_data=[blue])
    assert vl_engine.prefix_cache.hits == 1  # the same image: its conversation's KV is reused
    vl_engine.flush_cache()
    fresh = vl_engine.generate(input_ids=third, sampling_params=GREEDY, return_logprob=True, image_data=[blue])
    assert cached["output_ids"] == fresh["output_ids"]
    for x, y in zip(cached["meta_info"]["output_token_logprobs"], fresh["meta_info"]["output_token_logprobs"]):
        assert x[0] == pytest.approx(y[0], abs=1e-4)


# ------------------------------------------------------------------ training forward and weight sync


def _trajectories(processor, engine, n: int = 3) -> list[Trajectory]:
    model = ChatModel(model="vl", llm=engine, tokenizer=processor.tokenizer, processor=processor)
    out = []
    for k, rgb in enumerate([(255, 0, 0), (0, 0, 255), (0, 200, 0)][:n]):
        reply: AIMessage = asyncio.run(model.ainvoke(question(square(rgb, 56 + 28 * k)), sampling_params=SAMPLE))
        meta = reply.response_metadata
        p = meta["prompt_length"]
        out.append(
            Trajectory(
                group=0, sample=k, agent_name="vl", prompt_ids=meta["token_ids"][:p], all_token_ids=meta["token_ids"],
                loss_mask=meta["loss_mask"], response_logprobs=meta["logprobs"][p:], reward=float(k),
                multi_modal_inputs=meta["multi_modal_inputs"],
            )
        )  # fmt: skip
    return out


def test_training_log_probs_use_the_images_and_equal_the_engines(processor, vl_engine, vl_model) -> None:
    trajectories = _trajectories(processor, vl_engine)
    assert all(t.multi_modal_inputs is not None for t in trajectories)
    samples = prepare_samples(trajectories).samples
    settings = vision_settings(vl_model)
    results = []
    for rows in ([samples], [[s] for s in samples]):  # packed into one row, and one sample per row
        micro = collate(rows, pad_id=0, vision=settings)
        assert micro.mrope_position_ids is not None and micro.mrope_position_ids.shape[0] == 4
        with torch.no_grad():
            out = model_token_logprobs(vl_model, micro.model_inputs(), micro.targets, micro.loss_mask > 0)
        results.append([out.logprobs[micro.sequence_index == k].tolist() for k in range(len(samples))])
        for k, sample in enumerate(samples):
            mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
            ours = torch.tensor(results[-1][k])[mask]
            engine = torch.tensor(sample.old_logprobs)[mask]
            assert torch.allclose(ours, engine, atol=1e-4), (ours, engine)
    # Without the images the log-probs differ: the forward really used them.
    micro = collate([[samples[0]]], pad_id=0, vision=settings)
    blind = micro._replace(pixel_values=torch.zeros_like(micro.pixel_values))
    with torch.no_grad():
        seen = model_token_logprobs(vl_model, micro.model_inputs(), micro.targets, micro.loss_mask > 0).logprobs
        unseen = model_token_logprobs(vl_model, blind.model_inputs(), micro.targets, micro.loss_mask > 0).logprobs
    assert not torch.allclose(seen, unseen)


def test_gradients_reach_the_vision_tower_and_sync_includes_it(processor, vl_dir, vl_engine) -> None:
    policy = AutoModelForImageTextToText.from_pretrained(vl_dir).train()
    samples = prepare_samples(_trajectories(processor, vl_engine, n=2)).samples
    micro = collate([[s] for s in samples], pad_id=0, vision=vision_settings(policy))
    out = model_token_logprobs(policy, micro.model_inputs(), micro.targets, micro.loss_mask > 0)
    out.logprobs.sum().backward()
    grad = policy.model.visual.blocks[0].mlp.down_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.01)
    name = "model.visual.blocks.0.mlp.down_proj.weight"
    before = vl_engine.get_weights_by_name(name)
    assert sync_weights(policy, [vl_engine]).tensors == len(list(policy.named_parameters()))
    after = vl_engine.get_weights_by_name(name)
    assert torch.allclose(after, dict(policy.named_parameters())[name].detach()) and not torch.equal(before, after)


def test_fsdp_shards_the_vision_blocks_and_the_decoder_layers(vl_model) -> None:
    units = shard_units(vl_model)
    assert [*vl_model.model.visual.blocks, *vl_model.model.language_model.layers] == units


# ------------------------------------------------------------------ rows with images


def test_attach_images_puts_each_image_where_the_text_says() -> None:
    rows = attach_images([{"role": "user", "content": "<image>Find x. <image> too"}], ["a.png", "b.png"])
    assert rows[0]["content"] == [
        {"type": "image", "image": "a.png"},
        {"type": "text", "text": "Find x."},
        {"type": "image", "image": "b.png"},
        {"type": "text", "text": "too"},
    ]
    front = attach_images([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], ["c.png"])
    assert front[1]["content"] == [{"type": "image", "image": "c.png"}, {"type": "text", "text": "q"}]


def test_rows_with_images_are_validated_at_setup(tmp_path: Path) -> None:
    from lit_agentrl.data import row_errors

    good = tmp_path / "fig.png"
    square((1, 2, 3)).save(good)
    (tmp_path / "broken.png").write_bytes(b"not an image")
    buffer = io.BytesIO()
    square((4, 5, 6)).save(buffer, format="PNG")
    base = {"agent_name": "single_turn", "prompt": [{"role": "user", "content": "<image>q"}]}
    ok = [str(good), {"path": str(good)}, {"bytes": buffer.getvalue()}]
    assert row_errors({**base, "images": ok}, tmp_path, None) == []
    errors = row_errors(
        {**base, "images": [str(tmp_path / "missing.png"), str(tmp_path / "broken.png"), 3]}, tmp_path, None
    )
    assert len(errors) == 3 and all("field 'images'" in e for e in errors)
    assert row_errors({**base, "images": "fig.png"}, tmp_path, None) == [
        "field 'images' must be a list of images, got string 'fig.png'"
    ]
