"""Test-only: lets SGLang 0.5.23's LoRA serving start on a machine without CUDA (see README.md, "LoRA on CPU").

SGLang's LoRA layers and its ``torch_native`` LoRA backend pin their host buffers (``pin_memory=True``,
``.pin_memory()``), which needs a CUDA driver, so on CPU the server dies at start-up. Pinning only speeds up copies to a
GPU and never changes a value; here, in a process that imports ``sglang.srt.lora`` with ``SGLANG_USE_CPU_ENGINE=1`` and
no CUDA, it becomes a no-op. Nothing else is touched, and nothing happens where CUDA is available.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
from typing import Any

_PINNING_FACTORIES = ("tensor", "empty", "zeros", "ones", "full", "arange", "empty_like", "zeros_like", "ones_like")


def _unpinned(factory: Any) -> Any:
    @functools.wraps(factory)
    def build(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    return build


def _pin_as_no_op() -> None:
    import torch

    if torch.cuda.is_available() or getattr(torch, "_lit_agentrl_pin_no_op", False):
        return
    torch._lit_agentrl_pin_no_op = True  # type: ignore[attr-defined]
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    for name in _PINNING_FACTORIES:
        setattr(torch, name, _unpinned(getattr(torch, name)))


class _OnSGLangLoRA(importlib.abc.MetaPathFinder):
    """Applies the no-op when ``sglang.srt.lora`` is first imported, then leaves the import to the usual finders."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "sglang.srt.lora":
            _pin_as_no_op()
        return None


if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    sys.meta_path.insert(0, _OnSGLangLoRA())
