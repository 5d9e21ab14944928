"""How peft names a policy's LoRA adapters, for every side that handles them (the trainer, the bridge, the engines).

Injected in place, each targeted linear becomes a peft ``Linear`` whose parameters are named ``<module>.base_layer
.weight`` and ``<module>.lora_{A,B}.default.weight``; peft saves the adapters as ``base_model.model.<module>.lora_A
.weight``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["ADAPTER", "PEFT_PREFIX", "adapter_parameter_names", "is_adapter", "saved_name"]

ADAPTER = "default"
"""peft's name for the one adapter."""
PEFT_PREFIX = "base_model.model."
"""What peft's saved adapters put before the model's own names."""
_ADAPTER_PART = re.compile(rf"\.(lora_[AB])\.{ADAPTER}\.")


def is_adapter(name: str) -> bool:
    """Whether the parameter ``name`` is an adapter's (``lora_A`` or ``lora_B``)."""
    return _ADAPTER_PART.search(name) is not None


def saved_name(name: str) -> str:
    """A parameter's name as peft saves adapters (``base_model.model.<module>.lora_A.weight``)."""
    return PEFT_PREFIX + _ADAPTER_PART.sub(r".\1.", name)


def adapter_parameter_names(names: Iterable[str]) -> dict[str, str]:
    """peft's saved name -> the model's own name, for each adapter parameter among ``names``."""
    return {saved_name(name): name for name in names if is_adapter(name)}
