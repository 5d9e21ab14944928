"""LoRA on the policy (``model.lora``): peft's adapters injected in place, the base frozen in its own dtype.

The adapters are injected into the transformers model itself (``peft.inject_adapter_in_model``), so the policy stays
a ``Qwen3ForCausalLM`` (FSDP2 shards its decoder layers as before): each targeted linear becomes a peft ``Linear``
holding ``base_layer`` and ``lora_A``/``lora_B`` (named as :mod:`lit_agentrl.models.lora_names` says). What the
engines and exports get of them (merged weights, or the adapters alone) is :mod:`lit_agentrl.bridge.lora`'s.

The reference policy of the KL term is the base itself: :func:`adapters_disabled` (no second copy).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch

from lit_agentrl.bridge.lora import peft_config, spelled_targets
from lit_agentrl.config.training import HEAD_REFUSAL, Lora, is_all_linear
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.dtypes import torch_dtype
from lit_agentrl.models.lora_names import is_adapter


def add_adapters(model: torch.nn.Module, lora: Lora) -> torch.nn.Module:
    """Inject ``lora``'s adapters into ``model`` in place (peft's initialisation: A random, B zero, so the policy
    starts as the base), freeze the rest in ``lora.base_dtype`` and keep the adapters in float32."""
    from peft import inject_adapter_in_model

    on_meta = any(param.is_meta for param in model.parameters())  # sharded before it is filled: adapters too
    targets = target_module_names(model, lora)  # exactly these: the checks ran on what peft would otherwise expand
    inject_adapter_in_model(peft_config(lora, targets=targets), model, low_cpu_mem_usage=on_meta)
    base_dtype = torch_dtype(lora.base_dtype, "model.lora.base_dtype")
    for name, param in model.named_parameters():
        adapter = is_adapter(name)
        param.requires_grad_(adapter)
        param.data = param.data.to(torch.float32 if adapter else base_dtype)
    return model


def target_module_names(model: torch.nn.Module, lora: Lora) -> list[str]:
    """The full names of the modules ``lora.target_modules`` selects in ``model``, by peft's rules (a list entry
    matches a name equal to it or ending in ``.`` and it; ``all-linear`` every linear layer but the output head; any
    other string is a regular expression matched against whole names).

    Raises :class:`UserInputError` naming ``model.lora.target_modules`` when a list entry matches no module (a typo
    beside good names would otherwise train the rest), when nothing is selected, or when the selection holds the
    head, the embeddings or a module that is not a linear layer (listing the linear layers' names in each case).
    """
    key = f"model.lora.target_modules={spelled_targets(lora)}"
    modules = dict(model.named_modules())
    head = _output_head(model)
    linear = [name for name, m in modules.items() if isinstance(m, torch.nn.Linear) and m is not head]
    valid = f"the model's linear layers are named {sorted({n.rsplit('.', 1)[-1] for n in linear})}"
    spec = lora.target_modules
    if is_all_linear(spec):
        selected = linear
    elif isinstance(spec, str):
        selected = [name for name in modules if name and re.fullmatch(spec, name)]
    else:
        by_entry = {t: [n for n in modules if n == t or n.endswith(f".{t}")] for t in spec}
        unmatched = [t for t, names in by_entry.items() if not names]
        if unmatched:
            raise UserInputError(f"{key}: {unmatched} match no module of the model; {valid}")
        selected = list(dict.fromkeys(n for names in by_entry.values() for n in names))
    _check_selection(selected, modules, head, key, valid)
    return selected


def _check_selection(
    selected: list[str], modules: dict[str, torch.nn.Module], head: torch.nn.Module | None, key: str, valid: str
) -> None:
    """Something selected, and only linear layers other than the head."""
    if not selected:  # a string is a pattern: peft reads `q_proj` alone as the whole name `q_proj`
        raise UserInputError(
            f"{key} matches no module of the model; {valid}",
            hint="one string is a regular expression that must match a module's whole name (peft's rule), e.g. "
            r"'.*\.(q_proj|v_proj)'; a list ([q_proj, v_proj]) matches by name",
        )
    refused = [n for n in selected if modules[n] is head or isinstance(modules[n], torch.nn.Embedding)]
    if refused:
        raise UserInputError(f"{key} selects {refused[:4]}: {HEAD_REFUSAL}")
    other = [f"{n} ({type(modules[n]).__name__})" for n in selected if not isinstance(modules[n], torch.nn.Linear)]
    if other:
        raise UserInputError(f"{key} selects modules that are not linear layers: {other[:4]}; {valid}")


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model, adapters bypassed, inside the block (the KL term's reference policy)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
