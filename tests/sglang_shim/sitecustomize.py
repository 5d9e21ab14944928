"""Test-only: lets SGLang 0.5.23's LoRA serving start on a machine without CUDA (see README.md, "LoRA on CPU").

SGLang's LoRA layers and its ``torch_native`` LoRA backend pin their host buffers (``pin_memory=True``,
``.pin_memory()``), which needs a CUDA driver, so on CPU the server dies at start-up. Pinning only speeds up copies to a
GPU and never changes a value. In a process with ``SGLANG_USE_CPU_ENGINE=1`` and no CUDA, pinning becomes a no-op:

* ``Tensor.pin_memory()`` returns the tensor (without the shim it raises there, so no working path calls it);
* the modules of ``sglang.srt.lora`` see, under the name ``torch``, a view of torch whose factories drop
  ``pin_memory=True``. Torch's own factories stay untouched: wrapping them for the whole process changed the sampling
  of SGLang's non-LoRA paths.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

_LORA_PACKAGE = "sglang.srt.lora"
_PINNING_FACTORIES = frozenset({"tensor", "empty", "zeros", "ones", "full", "arange"})


class _TorchWithoutPinning:
    """torch, as the LoRA modules see it: every attribute torch's own, the factories without ``pin_memory``."""

    def __getattr__(self, name: str) -> Any:
        import torch

        attribute = getattr(torch, name)
        if name not in _PINNING_FACTORIES:
            return attribute

        @functools.wraps(attribute)
        def unpinned(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            return attribute(*args, **kwargs)

        return unpinned


class _UnpinnedLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        if getattr(module, "torch", None) is sys.modules.get("torch"):
            module.torch = _TorchWithoutPinning()  # type: ignore[attr-defined]


class _OnSGLangLoRA(importlib.abc.MetaPathFinder):
    """Loads the modules of ``sglang.srt.lora`` as usual, then hands them the torch view; the first such import also
    makes ``Tensor.pin_memory`` a no-op."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _LORA_PACKAGE and not fullname.startswith(_LORA_PACKAGE + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        import torch

        if torch.cuda.is_available():
            return spec
        torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
        spec.loader = _UnpinnedLoader(spec.loader)
        return spec


if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    sys.meta_path.insert(0, _OnSGLangLoRA())
