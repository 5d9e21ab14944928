"""AgentPromptDataModule: agent-tagged prompt rows, validated up front, split across ranks, resumable.

A row (JSON, JSONL or Parquet) carries the chat prompt, the routing key ``agent_name``, optionally the
agent's YAML ``agent_cfg_path``, the ground truth (``reward_model.ground_truth`` or ``ground_truth``) and
any extra fields, which reach the agent's ``run(**kwargs)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from lit_agentrl.agents.registry import import_agent_modules
from lit_agentrl.data.files import DataFile, short
from lit_agentrl.data.loader import PromptBatchLoader
from lit_agentrl.data.validation import check_ground_truths, load_validated_files, prompt_text
from lit_agentrl.errors import UserInputError
from lit_agentrl.rows import row_prompt
from lit_agentrl.types import PromptBatch


class AgentPromptDataModule(L.LightningDataModule):
    """Agent-tagged prompt rows for GRPO, validated before the first step.

    Args:
        train_files: JSON/JSONL/Parquet file(s) of training rows.
        val_files: file(s) of validation rows (optional).
        prompts_per_step: prompts per optimizer step across all ranks (each rank gets an equal share).
        val_prompts_per_step: prompts per validation batch across all ranks (default: ``prompts_per_step``).
        seed: seed of the per-epoch shuffle.
        shuffle: shuffle the training rows each epoch.
        agent_modules: modules (dotted names or ``.py`` paths) to import before validation, so users'
            ``@register`` agents exist.
        max_prompt_length: longest prompt, in tokens of the chat-templated prompt (without the agent's tool
            schemas); None: no limit.
        overlong_prompts: ``error`` refuses the data at setup, ``skip`` drops such rows and reports the count.
        tokenizer_path: the tokenizer that measures prompts (the CLI links it to ``model.model_path``).
        row_defaults: fields every row gets unless it has them, e.g. ``{agent_name: skyrl_gym, agent_cfg_path: ...}``
            to train another framework's files (SkyRL's parquet) unchanged.

    Example (YAML, under ``data:``)::

        train_files: data/samples/math_sample_train.jsonl
        prompts_per_step: 8
    """

    def __init__(
        self,
        train_files: str | list[str],
        val_files: str | list[str] | None = None,
        prompts_per_step: int = 8,
        val_prompts_per_step: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        agent_modules: list[str] | None = None,
        max_prompt_length: int | None = None,
        overlong_prompts: Literal["error", "skip"] = "error",
        tokenizer_path: str | None = None,
        row_defaults: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if prompts_per_step < 1:
            raise UserInputError(f"data.prompts_per_step must be >= 1, got {prompts_per_step}")
        self.train_files = [train_files] if isinstance(train_files, str) else list(train_files)
        self.val_files = [val_files] if isinstance(val_files, str) else list(val_files or [])
        self.prompts_per_step = prompts_per_step
        self.val_prompts_per_step = val_prompts_per_step or prompts_per_step
        self.seed, self.shuffle = seed, shuffle
        self.agent_modules = list(agent_modules or [])
        if overlong_prompts not in ("error", "skip"):
            raise UserInputError(f"data.overlong_prompts must be 'error' or 'skip', got {overlong_prompts!r}")
        if max_prompt_length is not None and max_prompt_length < 1:
            raise UserInputError(f"data.max_prompt_length must be >= 1 or null, got {max_prompt_length}")
        self.max_prompt_length = max_prompt_length
        self.row_defaults = dict(row_defaults or {})
        self.overlong_prompts = overlong_prompts
        self.tokenizer_path = tokenizer_path
        self._train_loader: PromptBatchLoader | None = None
        self._val_loader: PromptBatchLoader | None = None
        self._files: list[DataFile] = []  # every file loaded, its rows' places kept for the reward check

    def setup(self, stage: str) -> None:
        for module in self.agent_modules:
            _import_agent_module(module)
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        for name, size in (
            ("data.prompts_per_step", self.prompts_per_step),
            ("data.val_prompts_per_step", self.val_prompts_per_step),
        ):
            if size % world:
                raise UserInputError(f"{name}={size} must be divisible by the number of processes ({world})")
        if stage == "fit" and self._train_loader is None:
            rows = self._limit_prompt_length(self._load(self.train_files), self.train_files)
            if len(rows) < self.prompts_per_step:
                raise UserInputError(
                    f"{self.train_files}: {len(rows)} rows, fewer than data.prompts_per_step={self.prompts_per_step}"
                )
            self._train_loader = PromptBatchLoader(
                rows, self.prompts_per_step, self.seed, self.shuffle, rank, world, "train"
            )
        if self.val_files and self._val_loader is None and stage in ("fit", "validate"):
            rows = self._limit_prompt_length(self._load(self.val_files), self.val_files)
            self._val_loader = PromptBatchLoader(
                rows, self.val_prompts_per_step, self.seed, False, rank, world, "val", whole_epoch=True
            )

    def check_ground_truths(self, reward_fn: str | None, key: str) -> None:
        """Refuse rows that the default reward ``reward_fn`` (set by the config key ``key``) would score without a
        ground truth (rows whose ``data_source`` picks a reward were checked when loaded)."""
        check_ground_truths(self._files, reward_fn, key)

    def _load(self, paths: list[str]) -> list[dict[str, Any]]:
        files = load_validated_files(paths, reward_fn=None, row_defaults=self.row_defaults)
        self._files += files
        return [row for file in files for row in file.rows]

    def _limit_prompt_length(self, rows: list[dict[str, Any]], files: list[str]) -> list[dict[str, Any]]:
        """Refuse or drop rows whose prompt exceeds ``max_prompt_length`` tokens (images counted as the tokens they
        widen to: :mod:`lit_agentrl.data.prompt_tokens`)."""
        if self.max_prompt_length is None:
            return rows
        if not self.tokenizer_path:
            raise UserInputError(
                "data.max_prompt_length needs data.tokenizer_path (the CLI links it to model.model_path)"
            )
        from lit_agentrl.data.prompt_tokens import PromptMeasure

        measure = PromptMeasure(self.tokenizer_path)
        try:
            over = [i for i, row in enumerate(rows) if measure(row) > self.max_prompt_length]
        except ValueError as exc:
            raise UserInputError(f"{files}: {exc}") from exc
        if not over:
            return rows
        example = short(prompt_text(row_prompt(rows[over[0]])[-1]))
        what = f"{files}: {len(over)} of {len(rows)} prompts are longer than data.max_prompt_length={self.max_prompt_length} tokens (e.g. {example})"
        if self.overlong_prompts == "error":
            raise UserInputError(what, hint="raise data.max_prompt_length or set data.overlong_prompts: skip")
        rank_zero_info(f"AgentPromptDataModule: skipping them. {what}")
        dropped = set(over)
        return [row for i, row in enumerate(rows) if i not in dropped]

    def train_dataloader(self) -> PromptBatchLoader:
        assert self._train_loader is not None, "setup('fit') must run first"
        return self._train_loader

    def draw_extra_train_rows(self) -> list[dict[str, Any]]:
        """This rank's share of one more step's worth of training prompts (dynamic sampling)."""
        assert self._train_loader is not None, "setup('fit') must run first"
        return self._train_loader.draw_extra()

    def val_dataloader(self) -> PromptBatchLoader | list:
        if self._val_loader is None:
            return []
        self._val_loader.consumed = 0  # validation always runs the whole set
        return self._val_loader

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, PromptBatch) and batch.split == "train" and self._train_loader is not None:
            self._train_loader.mark_consumed(batch)
        return batch


def _import_agent_module(module: str) -> None:
    """Import one of ``data.agent_modules``; a file that is not there or a module that does not import is the
    config's mistake, named with the key (a module that raises anything else is a bug in it, and keeps its traceback)."""
    try:
        import_agent_modules([module])
    except FileNotFoundError:
        where = "" if Path(module).is_absolute() else f" (relative to the working directory {str(Path.cwd())!r})"
        raise UserInputError(f"data.agent_modules: the file {module!r} does not exist{where}") from None
    except ModuleNotFoundError as exc:
        missing = exc.__cause__ if isinstance(exc.__cause__, ModuleNotFoundError) else exc
        raise UserInputError(
            f"data.agent_modules: {module!r} does not import ({missing})",
            hint="a dotted name is imported from sys.path (the installed packages and the working directory); "
            "name a file by its path, ending in .py",
        ) from exc
