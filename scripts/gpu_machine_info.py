"""What the machine running scripts/gpu_checks.py has: versions, the GPU, SGLang, every installed distribution."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from typing import Any

from gpu_profiles import GB, PEAK_BF16_FLOPS, Profile


def sglang_status() -> dict[str, Any]:
    """Whether SGLang imports, checked in a child process (so this one neither pays for it nor touches CUDA)."""
    if importlib.util.find_spec("sglang") is None:
        return {"importable": False, "version": None, "error": "sglang not installed"}
    code = "import sglang; print(sglang.__version__)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"importable": False, "version": None, "error": "import sglang took over 300 s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"importable": False, "version": None, "error": f"import sglang failed: {last}"}
    return {"importable": True, "version": done.stdout.strip(), "error": None}


def machine_info(sglang: dict[str, Any]) -> dict[str, Any]:
    """Versions and the GPU (creates a CUDA context: call it after the fit, whose device-wide memory it would join)."""
    import lightning
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch.version.cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "lightning": lightning.__version__,
        "sglang": sglang["version"] if sglang["importable"] else sglang["error"],
        "gpu": None,
        "gpu_memory_gb": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name, gpu_memory_gb=round(props.total_memory / GB, 1), gpu_count=torch.cuda.device_count()
        )
    return info


def installed_distributions() -> list[str]:
    """``name==version`` of every distribution this Python has installed (what ``pip list --format=freeze`` prints)."""
    found = {
        dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions() if dist.metadata["Name"]
    }
    return [f"{name}=={version}" for name, version in sorted(found.items(), key=lambda item: item[0].lower())]


def gpu_memory_bytes() -> int | None:
    """The first GPU's total memory in bytes; None without a CUDA GPU."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def peak_flops_for(profile: Profile, override_tflops: float | None) -> float | None:
    """The device's dense bf16 peak FLOP/s: ``--peak-tflops``, else looked up by the GPU's name; None on CPU."""
    if override_tflops:
        return override_tflops * 1e12
    import torch

    if profile.device != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((flops for fragment, flops in PEAK_BF16_FLOPS.items() if fragment in name), None)
