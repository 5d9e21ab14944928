"""A LoRA policy as the engines and exports get it: its weights with the adapters merged in, or the adapters alone.

* :func:`merged_named_parameters` gives the engines the plain model's names, each targeted weight with its adapter
  folded in (W + alpha/r B A): any engine takes them as a full push;
* :func:`adapter_named_parameters` gives the adapters alone under peft's saved names (``base_model.model.<module>
  .lora_A.weight``), with :func:`adapter_config` the ``adapter_config.json`` beside them.

Whether a run pushes the adapters alone is decided once, by ``Lora.syncs_adapter`` (``model.lora.sync: adapter``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from lit_agentrl.config.training import Lora
from lit_agentrl.models.lora_names import ADAPTER, is_adapter, saved_name

__all__ = ["adapter_config", "adapter_named_parameters", "merged_named_parameters", "peft_config", "spelled_targets"]


def peft_config(lora: Lora, base_model: str | None = None, targets: list[str] | None = None) -> Any:
    """peft's ``LoraConfig`` for ``lora`` (a causal LM, no bias), on ``targets`` (full module names) when given, else
    on ``lora.target_modules`` as spelled."""
    from peft import LoraConfig

    return LoraConfig(
        r=int(lora.rank or 0),
        lora_alpha=lora.scale_alpha,
        lora_dropout=lora.dropout,
        target_modules=targets if targets is not None else spelled_targets(lora),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )


def spelled_targets(lora: Lora) -> str | list[str]:
    """``lora.target_modules`` as peft takes it: a pattern string, or a list of names."""
    return lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)


def _full(param: torch.Tensor) -> torch.Tensor:
    tensor = param.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def merged_named_parameters(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the plain model, by its plain name, each targeted one with its adapter folded in
    (W + alpha/r B A, computed in float32), cast to ``dtype`` when given. Under FSDP2 each tensor is gathered, in
    the same order on every rank."""
    from peft.tuners.lora import LoraLayer

    params = dict(model.named_parameters())
    scales = {
        f"{name}.base_layer.weight": float(module.scaling[ADAPTER])
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer)
    }
    for name, param in params.items():
        if is_adapter(name):
            continue
        tensor = _full(param)
        if name in scales:
            module = name.removesuffix(".base_layer.weight")
            a = _full(params[f"{module}.lora_A.{ADAPTER}.weight"]).float()
            b = _full(params[f"{module}.lora_B.{ADAPTER}.weight"]).float()
            tensor = torch.addmm(tensor.float(), b, a, alpha=scales[name])
            name = f"{module}.weight"
        out = dtype if dtype is not None else torch.float32
        yield name, tensor.to(out) if tensor.is_floating_point() else tensor


def adapter_named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapters' full tensors under peft's saved names."""
    for name, param in model.named_parameters():
        if is_adapter(name):
            yield saved_name(name), _full(param)


def adapter_config(lora: Lora, base_model: str | None = None) -> dict[str, Any]:
    """The ``adapter_config.json`` of the adapters (peft's own fields)."""
    config = peft_config(lora, base_model).to_dict()
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
