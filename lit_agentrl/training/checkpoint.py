"""AtomicCheckpointIO: a checkpoint file appears whole or not at all.

Lightning writes a checkpoint straight to its final path; a crash mid-write (SIGKILL, a full disk) leaves a
truncated file where a good one may have been. This writes beside it and renames, which is atomic on POSIX
file systems, so an interrupted save leaves the previous checkpoint usable.

``lit-agentrl`` uses it by default: ``trainer.plugins: [{class_path: lit_agentrl.training.checkpoint.AtomicCheckpointIO}]``
(a class path, not an instance, so the saved config names it and re-runs); a config that sets ``trainer.plugins``
replaces that default, and lists it there to keep atomic writes.
Sharded checkpoints of ``ModelParallelStrategy`` are folders written by torch.distributed.checkpoint, whose
``.metadata`` file is written last: an interrupted one fails to load with a clear error, and step-named
folders (``ModelCheckpoint(save_top_k=-1)``) keep the previous one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that saves to a temporary file in the same folder, fsyncs, then renames."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            super().save_checkpoint(checkpoint, staging, storage_options)
            with open(staging, "rb") as f:
                os.fsync(f.fileno())
            os.replace(staging, path)
        finally:
            if staging.exists():
                staging.unlink()
