"""Checks of the policy made once it is built: what it can train with (packed sequences, the device mesh)."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from lit_agentrl.errors import UserInputError
from lit_agentrl.models.processors import vision_settings
from lit_agentrl.training.logprobs import relative_difference

__all__ = ["check_data_parallel_mesh", "check_packing_support"]


def check_packing_support(model: torch.nn.Module, tolerance: float = 1e-3) -> None:
    """Raise ``ValueError`` unless ``model`` keeps sequences packed into one row apart (by their position ids).

    Two short sequences go through the model packed into one row and one at a time; their logits must agree within
    ``tolerance`` of the largest logit (relative: it is the compute dtype's rounding that differs).
    """
    device = next(model.parameters()).device
    if device.type == "meta":  # weights not materialised yet: nothing to run
        return
    first, second = [3, 5, 7, 9, 11], [4, 6, 8]
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]], device=device)
    if vision_settings(model) is not None:  # Qwen2-VL family: text positions first, then the 3-D ones (collate's)
        positions = positions.unsqueeze(0).expand(4, -1, -1)
    with torch.no_grad():
        packed = model(
            input_ids=torch.tensor([first + second], device=device), position_ids=positions, use_cache=False
        ).logits[0]
        alone = [
            model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0] for ids in (first, second)
        ]
    if relative_difference(packed, torch.cat(alone)) > tolerance:
        raise UserInputError(
            f"{type(model).__name__} lets packed sequences attend to each other (it ignores restarting position ids); "
            "set model.sequence_packing: false"
        )


def check_data_parallel_mesh(mesh: DeviceMesh) -> None:
    """Only data parallelism is implemented: a tensor-parallel dimension would train divergent replicas."""
    names = mesh.mesh_dim_names or ()
    tensor_parallel = mesh["tensor_parallel"].size() if "tensor_parallel" in names else 1
    if tensor_parallel > 1:
        raise UserInputError(
            f"trainer.strategy.tensor_parallel_size={tensor_parallel} is not supported: GRPOModule shards the policy "
            "over data parallelism only (FSDP2). Set tensor_parallel_size: 1 and data_parallel_size to the number "
            "of processes."
        )
