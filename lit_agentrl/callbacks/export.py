"""HFExportCallback: save the policy in Hugging Face format (``save_pretrained``) every N steps and at the end."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from transformers import AutoTokenizer

from lit_agentrl.training.module import GRPOModule


class HFExportCallback(Callback):
    """Write ``dirpath/step-{N}`` (and ``dirpath/final``) loadable by ``AutoModelForCausalLM.from_pretrained``.

    Args:
        dirpath: folder of the exports.
        every_n_steps: export every N optimizer steps (None: only at the end).
        at_end: export when training ends.

    Under FSDP2 every rank joins the gather of the full weights; rank 0 writes. An export is written to a
    temporary folder and renamed into place, so an interrupted export never leaves a half-written model.
    """

    def __init__(self, dirpath: str = "outputs/hf", every_n_steps: int | None = None, at_end: bool = True) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or None, got {every_n_steps}")
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.at_end = at_end
        self._last_exported_step = -1

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step != self._last_exported_step:
            self.export(trainer, pl_module, self.dirpath / f"step-{step}")
            self._last_exported_step = step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_end:
            self.export(trainer, pl_module, self.dirpath / "final")

    def export(self, trainer: L.Trainer, pl_module: L.LightningModule, target: Path) -> None:
        """Gather the full weights (all ranks) and save model, config and tokenizer to ``target`` (rank 0)."""
        if not isinstance(pl_module, GRPOModule):
            raise TypeError(f"HFExportCallback exports a GRPOModule's policy, not a {type(pl_module).__name__}")
        state = _full_state_dict(pl_module.policy)
        if trainer.is_global_zero:
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
            pl_module.policy.save_pretrained(staging, state_dict=state)
            AutoTokenizer.from_pretrained(pl_module.model_path).save_pretrained(staging)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
            rank_zero_info(f"HFExportCallback: saved the policy to {target}")
        trainer.strategy.barrier("hf_export")


def _full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on CPU (a collective under FSDP2; a plain copy otherwise)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast(dict[str, torch.Tensor], state)  # a causal LM's state dict holds tensors only
