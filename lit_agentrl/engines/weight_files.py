"""Weights through shared storage: a bucket of tensors written as one safetensors file in a folder of its own, for a
server to load (SGLang's ``/update_weights_from_disk``), then removed.

SGLang 0.5.23 needs only the ``*.safetensors`` files of a folder (no ``config.json``) and updates just the tensors
they hold, so each bucket is a folder. Names and shapes are checked before writing (by the caller,
``check_named_tensors``): SGLang's disk loader accepts a tensor of the wrong shape and reports success. Each push gets
a fresh folder, since SGLang re-reads the folder it last loaded when it rolls a failed load back.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from lit_agentrl.errors import UserInputError


def checked_weights_dir(weights_dir: str | None) -> Path:
    """``engine.kwargs.weights_dir``, made if missing; refused when unset or not writable."""
    if not weights_dir:
        raise UserInputError(
            "engine.kwargs.transport: disk needs engine.kwargs.weights_dir, a folder on storage the trainer writes "
            "and every server reads (the same path on both sides)"
        )
    folder = Path(weights_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-check-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UserInputError(f"engine.kwargs.weights_dir {weights_dir!r} is not a writable folder: {exc}") from None
    return folder


@contextmanager
def bucket_folder(weights_dir: Path, pairs: list[tuple[str, torch.Tensor]]) -> Iterator[Path]:
    """A fresh folder under ``weights_dir`` holding ``pairs`` as ``model.safetensors`` (in their dtypes), removed when
    the block ends, loaded or not."""
    from safetensors.torch import save_file

    folder = weights_dir / f"push-{uuid.uuid4().hex}"
    folder.mkdir()
    try:
        save_file(
            {name: tensor.detach().cpu().contiguous() for name, tensor in pairs}, str(folder / "model.safetensors")
        )
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
