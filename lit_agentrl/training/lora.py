"""LoRA on the policy (``model.lora``): peft's adapters injected in place, the base frozen in its own dtype.

The adapters are injected into the transformers model itself (``peft.inject_adapter_in_model``), so the policy stays
a ``Qwen3ForCausalLM`` (FSDP2 shards its decoder layers as before): each targeted linear becomes a peft ``Linear``
holding ``base_layer`` and ``lora_A``/``lora_B``. Names gain ``.base_layer`` and ``.lora_{A,B}.default``:

* :func:`merged_named_parameters` gives the engines the plain model's names, each targeted weight with its adapter
  folded in (W + alpha/r B A): any engine takes them as a full push;
* :func:`adapter_named_parameters` gives the adapters alone under peft's saved names (``base_model.model.<module>
  .lora_A.weight``), with :func:`adapter_config` the ``adapter_config.json`` beside them.

The reference policy of the KL term is the base itself: :func:`adapters_disabled` (no second copy).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from lit_agentrl.config.training import HEAD_REFUSAL, Lora, is_all_linear
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.dtypes import torch_dtype

ADAPTER = "default"
"""peft's name for the one adapter."""
PEFT_PREFIX = "base_model.model."
"""What peft's saved adapters put before the model's own names."""
_ADAPTER_PART = re.compile(rf"\.(lora_[AB])\.{ADAPTER}\.")


def peft_config(lora: Lora, base_model: str | None = None, targets: list[str] | None = None) -> Any:
    """peft's ``LoraConfig`` for ``lora`` (a causal LM, no bias), on ``targets`` (full module names) when given, else
    on ``lora.target_modules`` as spelled."""
    from peft import LoraConfig

    return LoraConfig(
        r=int(lora.rank or 0),
        lora_alpha=lora.scale_alpha,
        lora_dropout=lora.dropout,
        target_modules=targets if targets is not None else _spelled(lora),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )


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
    key = f"model.lora.target_modules={_spelled(lora)}"
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


def _spelled(lora: Lora) -> str | list[str]:
    return lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def is_adapter(name: str) -> bool:
    return _ADAPTER_PART.search(name) is not None


def has_adapters(model: torch.nn.Module) -> bool:
    return any(is_adapter(name) for name, _ in model.named_parameters())


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


def saved_name(name: str) -> str:
    """A parameter's name as peft saves adapters (``base_model.model.<module>.lora_A.weight``)."""
    return PEFT_PREFIX + _ADAPTER_PART.sub(r".\1.", name)


def adapter_parameter_names(names: Iterable[str]) -> dict[str, str]:
    """peft's saved name -> the model's own name, for each adapter parameter among ``names``."""
    return {saved_name(name): name for name in names if is_adapter(name)}


def adapter_named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapters' full tensors under peft's saved names."""
    for name, param in model.named_parameters():
        if is_adapter(name):
            yield saved_name(name), _full(param)


def adapter_config(lora: Lora, base_model: str | None = None) -> dict[str, Any]:
    """The ``adapter_config.json`` of the adapters (peft's own fields)."""
    config = peft_config(lora, base_model).to_dict()
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
