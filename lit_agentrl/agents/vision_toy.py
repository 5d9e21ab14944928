"""``colour_name``: the vision quickstart's task. The model sees a coloured square on white and names its colour.

Each row holds the square's ``colour`` (one of :data:`COLOURS`) and a ``seed`` for where the square sits and how big
it is; the agent draws the image from them (so the data set is a few lines of JSON, no image files), asks the
row's question (its prompt) with the image put before the text as a content part, and scores the answer itself:
1.0 for the right colour word (alone; the end of the turn may follow), :data:`FORMAT_CREDIT` for another colour
word so, 0.0 otherwise. A model that cannot see the
image gets 1/4 of the colours right at best; only looking at the pixels pays more.

Agent YAML keys (all optional, ``configs/agents/colour_name.yaml``): ``image_size`` (pixels, square),
``format_credit``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from langgraph.graph import END

from lit_agentrl.agents.base import AgentGraphOutput
from lit_agentrl.agents.chat_graph import MODEL_NODE, ChatAgentGraph
from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.multimodal import attach_images
from lit_agentrl.agents.registry import register

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (235, 200, 20),
}
"""The colours a square may have, by the word that names it."""

FORMAT_CREDIT = 0.2
"""Reward of a well-formed wrong answer (a colour word, then the end of the turn)."""

QUESTION = "what colour is the square?"
_END_OF_TURN = ("<|im_end|>", "<|endoftext|>")


def draw_square(colour: str, seed: int, size: int = 56) -> Any:
    """A ``size`` x ``size`` white PIL image with a square of ``colour`` (a :data:`COLOURS` word) at a place and of a
    side drawn from ``seed`` (between half and four fifths of the image)."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    side = rng.randint(size // 2, size * 4 // 5)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    image = Image.new("RGB", (size, size), (255, 255, 255))
    ImageDraw.Draw(image).rectangle((x, y, x + side - 1, y + side - 1), fill=COLOURS[colour])
    return image


def colour_reward(completion: str, colour: str, format_credit: float = FORMAT_CREDIT) -> float:
    """1.0 for ``colour`` (alone, the end of the turn after it or not), ``format_credit`` for another colour word
    so, else 0.0."""
    ends = "|".join(re.escape(m) for m in _END_OF_TURN)
    match = re.fullmatch(rf"\s*({'|'.join(COLOURS)})\s*(?:{ends})?\s*", completion)
    if match is None:
        return 0.0
    return 1.0 if match.group(1) == colour else format_credit


@register("colour_name")
class ColourNameAgentGraph(ChatAgentGraph):
    """One model turn on a generated image: the model names the square's colour; the agent scores the answer."""

    required_fields: ClassVar[tuple[str, ...]] = ("colour", "seed")

    @classmethod
    def row_errors(cls, row: Mapping[str, Any]) -> list[str]:
        errors = []
        if row.get("colour") is not None and row.get("colour") not in COLOURS:
            errors.append(f"field 'colour' must be one of {list(COLOURS)}, got {row.get('colour')!r}")
        if row.get("seed") is not None and not isinstance(row.get("seed"), int):
            errors.append(f"field 'seed' must be an integer, got {row.get('seed')!r}")
        return errors

    def build_graph(self) -> Any:
        self.chatmodel = self.make_chat_model()
        workflow = self.chat_workflow()
        workflow.add_edge(MODEL_NODE, END)
        self.graph = workflow.compile()
        return self.graph

    async def run(self, messages: Sequence[Any], sampling_params: Mapping[str, Any], **kwargs: Any) -> AgentGraphOutput:
        colour, seed = str(kwargs["colour"]), int(kwargs["seed"])
        image = draw_square(colour, seed, int(cfg_get(self.cfg, "image_size", 56)))
        prompt = attach_images(messages, [image])  # before the question's text
        output = self.convert_agent_graph_output(await self.invoke_graph(prompt, sampling_params))
        credit = float(cfg_get(self.cfg, "format_credit", FORMAT_CREDIT))
        output.reward_score = colour_reward(output.str_output, colour, credit)
        output.extra_fields.setdefault("metrics", {})["seen_colour"] = float(output.reward_score == 1.0)
        return output
