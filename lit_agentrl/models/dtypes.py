"""The floating-point dtypes a config may name, in one place for the trainer and the engines."""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str, where: str, allowed: tuple[str, ...] = tuple(TORCH_DTYPES)) -> torch.dtype:
    """The dtype called ``name``; ``ValueError`` naming the setting ``where`` and the valid names otherwise."""
    if name not in allowed:
        raise ValueError(f"{where} must be one of {list(allowed)}, got {name!r}")
    return TORCH_DTYPES[name]


def dtype_bytes(name: str) -> int:
    """Bytes per element of the dtype called ``name`` (a config's ``float32``, ``bfloat16`` or ``float16``)."""
    return TORCH_DTYPES[name].itemsize
