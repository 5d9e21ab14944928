"""How many tokens a row's prompt takes, as the policy will see it: ``data.max_prompt_length`` measures with it.

A text prompt is the chat-templated prompt's tokens. A prompt with images (image parts in its messages, or the row's
``images`` put where its ``<image>`` placeholders are) is rendered through the vision-language processor's chat
template, and each image counts as the placeholder tokens it widens to (its merged patches), computed from the
image's size as the image processor resizes it, without running the image processor on every row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lit_agentrl.agents.multimodal import attach_images, template_messages, tokenizer_of
from lit_agentrl.models.processors import is_vision_language, load_image, load_processor
from lit_agentrl.rows import row_prompt


class PromptMeasure:
    """Counts a row's prompt tokens with the policy's tokenizer (and processor, for rows with images)."""

    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self.model_path = model_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self._processor: Any = None

    def __call__(self, row: Mapping[str, Any]) -> int:
        rendered, sources = template_messages(attach_images(row_prompt(row), row.get("images")))
        if not sources:
            text = self.tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        processor = self.processor()
        text = processor.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
        placeholders = len(tokenizer_of(processor).encode(text, add_special_tokens=False))
        return placeholders + sum(image_tokens(processor, source) - 1 for source in sources)

    def processor(self) -> Any:
        """The policy's processor, loaded on first use; ``ValueError`` when the policy is a text model."""
        if self._processor is None:
            if not is_vision_language(self.model_path):
                raise ValueError(
                    f"rows carry images, but the model {self.model_path!r} is a text model: train a vision-language "
                    "policy, or remove the images from the rows"
                )
            self._processor = load_processor(self.model_path)
        return self._processor


def image_tokens(processor: Any, source: Any) -> int:
    """The placeholder tokens one image widens to (its patches after the image processor's resize, merged)."""
    image_processor = processor.image_processor
    width, height = load_image(source).size
    patches = image_processor.get_number_of_image_patches(height, width, {})
    return int(patches) // int(getattr(image_processor, "merge_size", 2)) ** 2
