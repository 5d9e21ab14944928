"""Test-only stand-in for SGLang's CUDA kernel package ``sgl_kernel`` (see ../README.md).

SGLang imports ``sgl_kernel`` (and submodules such as ``sgl_kernel.kvcacheio``, ``sgl_kernel.flash_attn``,
``sgl_kernel.scalar_type``) at module level even when it serves on CPU, where none of those kernels is called.
The real package is CUDA-only, so the CPU test environment puts this directory on ``PYTHONPATH`` instead.

Every import and attribute access succeeds: ``sgl_kernel.<anything>`` and ``sgl_kernel.<sub>.<anything>``
(to any depth) are stub classes, so they also work as annotations, in ``X | None``, as base classes and as
dictionary keys. Only *calling* one fails, loudly::

    RuntimeError: sgl_kernel.rmsnorm called: the CPU test path must not use CUDA kernels

Nothing is registered under ``torch.ops.sgl_kernel``, so SGLang's CPU checks (for example the Intel AMX
backend, which probes ``torch.ops.sgl_kernel.convert_weight_packed``) still see no kernels and take the plain
PyTorch path.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+cpu-test-shim"
SHIM = True
"""Marks this package as the test shim, not the real kernels."""

_PACKAGE = __name__  # "sgl_kernel"


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class _StubMeta(type):
    """Metaclass of the stubs: attribute access makes a deeper stub, calling raises."""

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"{cls.__module__}.{cls.__qualname__} called: the CPU test path must not use CUDA kernels")

    def __getattr__(cls, name: str):
        if _is_dunder(name):
            raise AttributeError(name)
        child = _stub(f"{cls.__qualname__}.{name}")
        type.__setattr__(cls, name, child)
        return child

    def __repr__(cls) -> str:
        return f"<sgl_kernel test stub {cls.__module__}.{cls.__qualname__}>"


def _stub(qualname: str) -> type:
    """A stub named ``sgl_kernel.<qualname>`` (``qualname`` is dotted below the top package)."""
    return _StubMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "__module__": _PACKAGE})


def _module_getattr(module: types.ModuleType):
    def __getattr__(name: str):
        if _is_dunder(name):
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        value = _stub(f"{module.__name__}.{name}".partition(".")[2])
        setattr(module, name, value)
        return value

    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Synthesises any ``sgl_kernel.<a>[.<b>...]`` submodule as a stub package."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PACKAGE + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return None  # default module creation

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = _module_getattr(module)


__path__ = []  # no real submodules on disk: every one comes from the finder
__getattr__ = _module_getattr(sys.modules[__name__])

if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())


# Four CPU ops that SGLang 0.5.23 looks up when a module is imported, never calls for the models tested here:
# sglang/srt/models/qwen3_5.py (under ``if _is_cpu``) binds ``torch.ops.sgl_kernel.fused_sigmoid_mul_cpu`` and
# three more at import, and the Qwen-VL multimodal processor imports that module (through interns2_mobius.py). Absent,
# the lookup raises AttributeError, SGLang's processor registry skips the Qwen-VL processor, and a Qwen2.5-VL server
# dies at start ("No processor registered for architecture"). Their schemas are declared here without kernels, so a
# call still fails loudly; every other name under torch.ops.sgl_kernel stays absent (the CPU probes above).
IMPORT_ONLY_CPU_OPS = (
    "fused_sigmoid_mul_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
)


def _declare_import_only_ops() -> None:
    import torch

    library = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name in IMPORT_ONLY_CPU_OPS:
        if not hasattr(torch.ops.sgl_kernel, name):
            library.define(name + "(Tensor x) -> ()")
    _LIBRARIES.append(library)  # a Library drops its definitions when collected


_LIBRARIES: list = []
_declare_import_only_ops()
