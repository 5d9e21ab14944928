"""Geometry3K end to end on a tiny Qwen2.5-VL built locally: the built-in ``geo3k_agent`` (a model/tool loop with the
answer-checking tool) on the rows ``data/prepare_geo3k.py`` writes, the seed-style agent on rows laid out as the seed's
own preprocessing writes them (figures as base64 ``image_url`` parts, in a Parquet file written by ``datasets``), the
agent YAML's chat template, and ``data.max_prompt_length`` counting image tokens.
"""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("PIL")

from PIL import Image
from support import ScriptedEngine, tool_call_text

from lit_agentrl.agents.multimodal import encode_multimodal
from lit_agentrl.data import AgentPromptDataModule, load_and_validate
from lit_agentrl.data.prompt_tokens import PromptMeasure
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.processors import load_processor
from lit_agentrl.models.tiny_vl import TinyVLConfig, save_tiny_vl_model, vl_chat_template
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.training.batching import prepare_samples

REPO = Path(__file__).resolve().parents[2]
GEO3K_YAML = REPO / "configs" / "agents" / "geo3k.yaml"
SAMPLE = {"max_new_tokens": 6, "temperature": 1.0}
SCRIPTED = {"max_new_tokens": 64, "temperature": 1.0}


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The BPE tokenizer: it writes tool calls, and the untrained model rarely draws the image placeholder itself.
    return save_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl-bpe"), TinyVLConfig())


def figure(rgb: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> Image.Image:
    image = Image.new("RGB", size, (255, 255, 255))
    image.paste(Image.new("RGB", (size[0] // 2, size[1] // 2), rgb), (size[0] // 4, size[1] // 4))
    return image


def prepared_row(image_path: Path, answer: str = "3") -> dict:
    """A row as data/prepare_geo3k.py writes it."""
    return {
        "data_source": "hiyouga/geometry3k",
        "agent_name": "geo3k_agent",
        "agent_cfg_path": str(GEO3K_YAML),
        "prompt": [
            {"role": "system", "content": "Check your answer with the tool."},
            {
                "role": "user",
                "content": [{"type": "image", "image": str(image_path)}, {"type": "text", "text": "Find x."}],
            },
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
    }


def seed_layout_rows(agent_name: str, cfg_path: Path) -> list[dict]:
    """Rows laid out as the seed's geo3k_agent.py preprocessing writes them: a system turn whose content is a list of
    text parts, the figure as a base64 JPEG ``image_url`` part before the text, the ground truth in reward_model."""
    rows = []
    for index, rgb in enumerate([(200, 30, 30), (30, 30, 200)]):
        buffer = io.BytesIO()
        figure(rgb).save(buffer, format="JPEG", quality=100)
        data_url = "data:image;base64," + base64.b64encode(buffer.getvalue()).decode()
        rows.append(
            {
                "agent_name": agent_name,
                "agent_cfg_path": str(cfg_path),
                "data_source": "hiyouga/geometry3k",
                "messages": [
                    {"role": "system", "content": [{"type": "text", "text": "You are a math expert."}]},
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": data_url},
                            {"type": "text", "text": "Find the area. Put it in \\boxed{}."},
                        ],
                    },
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(10 + index)},
                "extra_info": {"split": "train", "index": index, "answer": str(10 + index), "question": "area"},
            }
        )
    return rows


def test_the_shipped_geo3k_template_lists_tools_and_renders_images() -> None:
    template = yaml.safe_load(GEO3K_YAML.read_text())["chat_template"]
    assert template == vl_chat_template()
    assert "<tools>" in template and "<|image_pad|>" in template


@pytest.mark.parametrize("layout", ["image_parts", "images_field"])
def test_geo3k_agent_checks_its_answer_with_the_tool(tmp_path: Path, vl_dir: Path, layout: str) -> None:
    from transformers import AutoModelForImageTextToText

    processor = load_processor(str(vl_dir))
    figure((10, 20, 30)).save(tmp_path / "0-0.png")
    row = prepared_row(tmp_path / "0-0.png")
    if layout == "images_field":  # verl's layout: an images list, and <image> where the figure goes
        row["prompt"][1]["content"] = "<image>Find x."
        row["images"] = [str(tmp_path / "0-0.png")]
    rows = load_and_validate([_write_jsonl(tmp_path / "train.jsonl", [row])], None)
    model = AutoModelForImageTextToText.from_pretrained(vl_dir).eval()
    replies = [f"<think>x is 3</think>{tool_call_text('calc_geo3k_reward', {'answer': '3'})}", "\\boxed{3}"]
    engine = ScriptedEngine(model, processor.tokenizer, replies)
    manager = RolloutManager([engine], processor.tokenizer, processor=processor, check_template_drift=True)
    batch = manager.generate(rows, n_samples=1, sampling_params=SCRIPTED)
    manager.close()
    assert batch.stats.num_failed == 0, batch.stats.failure_reasons
    assert batch.stats.template_drift == 0
    (trajectory,) = batch.trajectories
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert trajectory.messages[3]["content"] == "The answer is correct."
    # The geo3k reward on the whole response (as the seed scores it): the right boxed answer after <think> reasoning.
    assert trajectory.reward == pytest.approx(1.0)
    tools_listed = processor.tokenizer.decode(engine.calls[0])
    assert "calc_geo3k_reward" in tools_listed and tools_listed.count("<|image_pad|>") == 4
    assert trajectory.multi_modal_inputs["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_a_seed_style_geo3k_agent_runs_on_rows_in_the_seeds_layout(tmp_path: Path, vl_dir: Path) -> None:
    datasets = pytest.importorskip("datasets")
    sys.path.insert(0, str(REPO / "tests" / "agents"))
    import seed_geo3k_style_agent  # noqa: F401  (registers seed_geo3k_style)

    cfg = tmp_path / "geo3k_eval.yaml"
    cfg.write_text(GEO3K_YAML.read_text())  # the seed's YAML has the same three keys: its template, turns, tokens
    parquet = tmp_path / "train_agent.parquet"
    # datasets fills every part with every key (a text part gets "image_url": None), as the seed's files have them.
    datasets.Dataset.from_list(seed_layout_rows("seed_geo3k_style", cfg)).to_parquet(str(parquet))
    rows = load_and_validate([str(parquet)], None)
    assert rows[0]["messages"][1]["content"][1]["image_url"] is None

    processor = load_processor(str(vl_dir))
    engine = TransformersEngine(str(vl_dir), seed=0)
    try:
        manager = RolloutManager([engine], processor.tokenizer, processor=processor, check_template_drift=True)
        batch = manager.generate(rows, n_samples=2, sampling_params=SAMPLE)
        manager.close()
    finally:
        engine.shutdown()
    assert batch.stats.num_failed == 0, batch.stats.failure_reasons
    assert batch.stats.template_drift == 0
    for trajectory in batch.trajectories:
        assert trajectory.multi_modal_inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
        assert trajectory.prompt_ids.count(processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")) == 4
    assert len(prepare_samples(batch.trajectories).samples) == 4


def test_image_parts_in_rows_are_validated_at_setup(tmp_path: Path) -> None:
    figure((1, 2, 3)).save(tmp_path / "ok.png")
    good = prepared_row(tmp_path / "ok.png")
    broken = prepared_row(tmp_path / "missing.png")
    bad_part = prepared_row(tmp_path / "ok.png")
    bad_part["prompt"][1]["content"].append({"type": "audio", "audio": "x.wav"})
    path = _write_jsonl(tmp_path / "rows.jsonl", [good, broken, bad_part])
    with pytest.raises(UserInputError) as error:
        load_and_validate([path], None)
    message = str(error.value)
    assert "line 2: field 'prompt'[1].content[0]: image" in message and "missing.png" in message
    assert "line 3: field 'prompt'[1].content[2] must be a text part" in message


def test_max_prompt_length_counts_each_images_tokens(tmp_path: Path, vl_dir: Path) -> None:
    processor = load_processor(str(vl_dir))
    figure((9, 9, 9), (112, 112)).save(tmp_path / "big.png")  # 16 image tokens
    figure((9, 9, 9), (56, 56)).save(tmp_path / "small.png")  # 4 image tokens
    rows = [prepared_row(tmp_path / "big.png"), prepared_row(tmp_path / "small.png")]
    measure = PromptMeasure(str(vl_dir))
    for row in rows:  # exactly the ids the agent sends the engine
        ids, _ = encode_multimodal("geo3k_agent", processor, row["prompt"], None, {})
        assert measure(row) == len(ids)
    small = measure(rows[1])
    assert measure(rows[0]) == small + 12

    data = AgentPromptDataModule(
        _write_jsonl(tmp_path / "rows.jsonl", rows),
        prompts_per_step=1,
        max_prompt_length=small,
        overlong_prompts="skip",
        tokenizer_path=str(vl_dir),
    )
    data.setup("fit")
    assert len(data.train_dataloader().rows) == len(rows) - 1  # the longer prompt skipped


def test_rows_with_images_for_a_text_model_fail_at_setup(tmp_path: Path) -> None:
    from lit_agentrl.models.tiny import save_tiny_model

    text_model = save_tiny_model(tmp_path / "tiny")
    figure((1, 2, 3)).save(tmp_path / "ok.png")
    data = AgentPromptDataModule(
        _write_jsonl(tmp_path / "rows.jsonl", [prepared_row(tmp_path / "ok.png")]),
        prompts_per_step=1,
        max_prompt_length=512,
        tokenizer_path=str(text_model),
    )
    with pytest.raises(UserInputError, match=r"rows carry images, but the model .* is a text model"):
        data.setup("fit")


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    import json

    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)
