"""HFExportCallback: save the policy in Hugging Face format (``save_pretrained``) every N steps and at the end; a LoRA
policy as a peft adapter folder, and on request its merged weights too (at the end, or in every export)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from safetensors.torch import save_file
from transformers import AutoTokenizer

from lit_agentrl.bridge.lora import adapter_config, adapter_named_parameters, merged_named_parameters
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.dtypes import torch_dtype
from lit_agentrl.training.module import GRPOModule


class HFExportCallback(Callback):
    """Write ``dirpath/step-{N}`` (and ``dirpath/final``) loadable by ``AutoModelForCausalLM.from_pretrained``.

    Args:
        dirpath: folder of the exports.
        every_n_steps: export every N optimizer steps (None: only at the end).
        at_end: export when training ends (also when a fit resumed from a checkpoint at ``max_steps`` has no step
            left to train: the run it resumes may have died before writing it).
        merge_lora: with ``model.lora``, also write the base with the adapter merged in, in the base's dtype
            (``model.lora.base_dtype``, which its ``config.json`` states), under ``final/merged``: at the end only,
            since each is a full copy of the model (each export is otherwise a peft adapter folder:
            ``adapter_config.json`` with the base's absolute path, ``adapter_model.safetensors`` and the tokenizer,
            for ``PeftModel.from_pretrained(base, folder)``, SGLang's ``--lora-paths`` or vLLM).
        merge_lora_every_export: write the merged model in every export (``step-{N}/merged`` too), not only the
            last; needs ``merge_lora``.

    Under FSDP2 every rank joins the gather of the full weights; rank 0 writes. An export is written to a
    temporary folder and renamed into place, so an interrupted export never leaves a half-written model.
    """

    def __init__(
        self,
        dirpath: str = "outputs/hf",
        every_n_steps: int | None = None,
        at_end: bool = True,
        merge_lora: bool = False,
        merge_lora_every_export: bool = False,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise UserInputError(f"HFExportCallback.every_n_steps must be >= 1 or null, got {every_n_steps}")
        if merge_lora_every_export and not merge_lora:
            raise UserInputError("HFExportCallback.merge_lora_every_export needs merge_lora: true")
        if merge_lora and not (at_end or merge_lora_every_export):
            raise UserInputError(
                "HFExportCallback.merge_lora writes the merged model in the export at the end, and at_end is false: "
                "it would never be written",
                hint="set at_end: true, or merge_lora_every_export: true to merge in every step's export",
            )
        self.dirpath = Path(dirpath)
        self.merge_lora = merge_lora
        self.merge_lora_every_export = merge_lora_every_export
        self.every_n_steps = every_n_steps
        self.at_end = at_end
        self._last_exported_step = -1
        self._exported_at_end = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.merge_lora and isinstance(pl_module, GRPOModule) and not pl_module.lora.enabled:
            raise UserInputError(
                "HFExportCallback.merge_lora: true, but model.lora is off: every export is the whole model already",
                hint="drop merge_lora, or set model.lora.rank",
            )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step != self._last_exported_step:
            self.export(trainer, pl_module, self.dirpath / f"step-{step}", merge=self.merge_lora_every_export)
            self._last_exported_step = step

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._exported_at_end = False

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_end:
            self.export(trainer, pl_module, self.dirpath / "final", merge=self.merge_lora)
            self._exported_at_end = True

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A fit resumed from a checkpoint taken at max_steps skips the training loop, and on_train_end with it: the
        # run it resumes may have died before its final export, which would otherwise never be written.
        if self.at_end and not self._exported_at_end:
            self.export(trainer, pl_module, self.dirpath / "final", merge=self.merge_lora)
            self._exported_at_end = True

    def export(self, trainer: L.Trainer, pl_module: L.LightningModule, target: Path, merge: bool = False) -> None:
        """Gather the full weights (all ranks) and save model, config and tokenizer to ``target`` (rank 0); with a
        LoRA policy the adapter folder, and with ``merge`` the merged model beside it, in the base's dtype."""
        if not isinstance(pl_module, GRPOModule):
            raise TypeError(f"HFExportCallback exports a GRPOModule's policy, not a {type(pl_module).__name__}")
        lora = pl_module.lora if pl_module.lora.enabled else None
        if lora is None:
            files = {"": _full_state_dict(pl_module.policy)}
        else:  # gathered on every rank, in the same order
            files = {"adapter": {name: t.cpu() for name, t in adapter_named_parameters(pl_module.policy)}}
            if merge:  # in the dtype save_pretrained writes into config.json: the frozen base's
                dtype = torch_dtype(lora.base_dtype, "model.lora.base_dtype")
                files["merged"] = {name: t.cpu() for name, t in merged_named_parameters(pl_module.policy, dtype)}
        if trainer.is_global_zero:
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
            tokenizer = AutoTokenizer.from_pretrained(pl_module.model_path)
            for part, state in files.items():
                if part == "adapter":
                    save_file(state, str(staging / "adapter_model.safetensors"))
                    config = adapter_config(pl_module.lora, base_model=_absolute(pl_module.model_path))
                    (staging / "adapter_config.json").write_text(json.dumps(config, indent=2))
                    tokenizer.save_pretrained(staging)
                else:  # the model's own folder, or its merged twin (plain names)
                    pl_module.policy.save_pretrained(staging / part, state_dict=state)
                    tokenizer.save_pretrained(staging / part)
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


def _absolute(model_path: str) -> str:
    """A local base's absolute path (the adapter folder is loaded from anywhere); a hub name as it is."""
    path = Path(model_path)
    return str(path.resolve()) if path.exists() else model_path
