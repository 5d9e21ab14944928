"""Colocated mode: the trainer's parameters, gradients and optimizer state leave the accelerator while SGLang
generates on it, and come back for the update.

Everything is moved into new storage, so the old storage is freed (on CUDA, returned to the caching allocator;
``torch.cuda.empty_cache()`` hands it to SGLang) and, on CPU, a test sees the move as a changed ``data_ptr``.

FSDP2 keeps its own references to each shard (``FSDPParam._sharded_param_data``, the padded flat storage that the
all-gather reads). Parameters are therefore moved through ``model._apply``: ``FSDPModule._apply`` reshards first, and
afterwards ``reset_sharded_param()`` re-registers (and re-pads) each new local shard. DTensor parameters are swapped
in place (``torch.utils.swap_tensors``) and plain ones get ``param.data = ...``, so every ``torch.nn.Parameter``
stays the same Python object, as ``optimizer.state`` (keyed by parameter) needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor

__all__ = ["HOST", "TrainerOffload", "move_optimizer_state", "move_parameters"]

HOST = torch.device("cpu")
"""Where offloaded tensors go by default."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """What this process stores: a DTensor's local shard, else the tensor itself."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _nbytes(tensor: torch.Tensor) -> int:
    local = _local(tensor)
    return local.numel() * local.element_size()


def _is_accelerator(device: torch.device) -> bool:
    return device.type not in ("cpu", "meta")


def _copy(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of ``tensor`` on ``device`` in new storage; a DTensor stays a DTensor with the same mesh and placements
    (DTensor runs ``aten._to_copy`` on its local shard).

    Non-blocking whenever an accelerator is involved: accelerator -> CPU then allocates the host copy in pinned memory
    (ATen's ``_to_copy`` pins its output for a non-blocking device-to-host copy), and CPU -> accelerator is
    asynchronous from pinned memory. The caller synchronizes before anything reads the copies.
    """
    non_blocking = _is_accelerator(device) or _is_accelerator(_local(tensor).device)
    return tensor.to(device, non_blocking=non_blocking, copy=True)


def _synchronize(*devices: torch.device) -> None:
    """Wait for the non-blocking copies: host memory written by a device-to-host copy is valid only afterwards."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


@torch.no_grad()
def move_parameters(model: torch.nn.Module, device: torch.device | str) -> int:
    """Move ``model``'s parameters and their gradients (if any) to ``device`` in new storage; returns the bytes moved.

    Always copies (even CPU to CPU, which makes the move observable in CPU tests), through ``model._apply`` so that
    FSDP2 modules reshard before and re-register their shards after. Buffers (rotary ``inv_freq``: small, recomputed
    from the config) stay where they are. A parameter tied to another (shared object) is moved and counted once.
    """
    device = torch.device(device)
    params = list(model.parameters())  # deduplicated: a tied parameter appears once
    grads = [p.grad for p in params if p.grad is not None]
    targets = {id(t) for t in (*params, *grads)}  # the lists keep these objects, hence their ids, alive
    sources = {_local(t).device for t in (*params, *grads)}
    done: set[int] = set()
    moved = 0

    def to_device(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal moved
        if id(tensor) not in targets:
            return tensor  # a buffer: ``_apply`` reassigns it to itself
        if id(tensor) in done:
            # A tied parameter's second owner. ``_apply`` keeps the object (``.data =`` or a swap), so it already
            # holds the new storage; copying again would only allocate and count it twice.
            return tensor.detach()
        done.add(id(tensor))
        moved += _nbytes(tensor)
        return _copy(tensor, device)

    model._apply(to_device)
    _synchronize(device, *sources)
    return moved


def _keeps_host_step(group: dict) -> bool:
    """Whether this param group's ``step`` counters live on the host by design.

    torch's Adam/AdamW (``_init_group``): "Deliberately host `step` on CPU if both capturable and fused are off" (a
    0-dim CPU tensor, read without a device sync); with ``capturable`` or ``fused`` it is on the parameter's device
    and must move with the parameters (capturable asserts that the two share a device). A 0-dim ``step`` on the host
    is ambiguous after an offload (was it on the device before?); the group's flags are not.
    """
    return not (group.get("capturable", False) or group.get("fused", False))


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[dict, str, torch.Tensor, bool]]:
    """(state dict, key, tensor, keep on host) for every tensor in ``optimizer.state``, each parameter once."""
    seen: set[int] = set()
    for group in optimizer.param_groups:
        host_step = _keeps_host_step(group)
        for param in group["params"]:
            if id(param) in seen or param not in optimizer.state:
                continue
            seen.add(id(param))
            state = optimizer.state[param]
            for key, value in list(state.items()):
                if isinstance(value, torch.Tensor):
                    keep = host_step and key == "step" and value.dim() == 0 and value.device.type == "cpu"
                    yield state, key, value, keep


@torch.no_grad()
def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> int:
    """Move every tensor in ``optimizer.state`` (``exp_avg``, ``exp_avg_sq``, ``step``, ...; DTensors stay DTensors)
    to ``device`` in new storage; returns the bytes moved.

    A 0-dim CPU ``step`` of a group that is neither ``capturable`` nor ``fused`` stays where it is (torch hosts it
    on the CPU by design, see :func:`_keeps_host_step`): moving it to the GPU would make every step read it with a
    device sync, and it is a few bytes.
    """
    device = torch.device(device)
    moved = 0
    sources: set[torch.device] = set()
    for state, key, value, keep in _state_tensors(optimizer):
        if keep:
            continue
        sources.add(_local(value).device)
        moved += _nbytes(value)
        state[key] = _copy(value, device)
    _synchronize(device, *sources)
    return moved


@dataclass
class TrainerOffload:
    """The trainer's model and optimizer, moved between the training ``device`` and ``host`` memory.

    Colocated with SGLang, ``offload()`` frees the accelerator for generation (optimizer state first, the largest
    part, then parameters and any gradients) and ``restore()`` brings everything back before the update. Each part
    remembers where it is, so a second ``offload()`` or ``restore()`` is a no-op (returns 0).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    device: torch.device  # the training device
    host: torch.device = HOST
    _on_host: dict[str, int] = field(default_factory=dict, init=False, repr=False)  # part -> bytes on the host

    def __post_init__(self) -> None:
        self.device, self.host = torch.device(self.device), torch.device(self.host)

    def offload_optimizer(self) -> int:
        """Optimizer state to the host (nothing without an optimizer or before its first step); bytes moved."""
        if self.optimizer is None or "optimizer" in self._on_host:
            return 0
        self._on_host["optimizer"] = move_optimizer_state(self.optimizer, self.host)
        return self._on_host["optimizer"]

    def offload_parameters(self) -> int:
        """Parameters and their gradients to the host; bytes moved."""
        if "parameters" in self._on_host:
            return 0
        self._on_host["parameters"] = move_parameters(self.model, self.host)
        return self._on_host["parameters"]

    def offload(self) -> int:
        """Optimizer state, then parameters (and gradients), to the host; bytes moved."""
        return self.offload_optimizer() + self.offload_parameters()

    def restore(self) -> int:
        """Parameters (and gradients), then optimizer state, back to the training device; bytes moved."""
        moved = 0
        if self._on_host.pop("parameters", None) is not None:
            moved += move_parameters(self.model, self.device)
        if self._on_host.pop("optimizer", None) is not None:
            assert self.optimizer is not None
            moved += move_optimizer_state(self.optimizer, self.device)
        return moved

    @property
    def offloaded(self) -> bool:
        """Whether any part (optimizer state or parameters) is on the host now."""
        return bool(self._on_host)

    @property
    def offloaded_bytes(self) -> int:
        """Bytes on the host now, as counted when they were offloaded."""
        return sum(self._on_host.values())
