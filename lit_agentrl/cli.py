"""``lit-agentrl``: LightningCLI over GRPOModule and AgentPromptDataModule.

lit-agentrl fit --config configs/quickstart.yaml
lit-agentrl validate --config configs/quickstart.yaml --ckpt_path PATH
lit-agentrl plan --config configs/qwen3_8b_math_agent.yaml [--gpu-memory-gb 80] [--devices N] [--override KEY=VALUE]
"""

from __future__ import annotations

import csv
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger

from lit_agentrl.checkpoint import AtomicCheckpointIO
from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.module import GRPOModule

REWARD_KEY = "rollout/reward_mean"
DEFAULT_ROOT_DIR = "outputs"


class AgentRLCLI(LightningCLI):
    """LightningCLI that checks a GPU run's memory plan before ``fit`` loads anything, and afterwards prints where
    the metrics went and how the reward moved."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("model.model_path", "data.tokenizer_path")
        parser.add_argument(
            "--skip_memory_plan", type=bool, default=False, help="start a GPU run even if `lit-agentrl plan` refuses it"
        )

    def before_fit(self) -> None:
        """Refuse a GPU run that cannot fit (``lit_agentrl.plan``) before any weight is loaded."""
        settings = self.config[self.subcommand]
        if settings.get("skip_memory_plan") or not _plans_gpu_memory(settings):
            return
        import torch
        import yaml

        from lit_agentrl.plan import inputs_from_config, plan_memory

        config = yaml.safe_load(self._parser(self.subcommand).dump(settings, skip_none=False, skip_validation=True))
        gpu_memory = torch.cuda.get_device_properties(0).total_memory
        plan = plan_memory(inputs_from_config(config, gpu_memory))
        if not plan.fits:
            raise SystemExit(
                f"lit-agentrl fit: the run does not fit on this GPU ({gpu_memory / 1e9:.0f} GB): "
                f"{'; '.join(plan.reasons)}. `lit-agentrl plan --config ...` prints the whole plan; "
                "--skip_memory_plan true starts it anyway."
            )

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:
            return
        for logger in self.trainer.loggers:
            if isinstance(logger, CSVLogger):
                path = Path(logger.log_dir) / "metrics.csv"
                print(f"metrics: {path}")
                summary = reward_summary(path)
                if summary:
                    print(summary)


def _plans_gpu_memory(settings: Any) -> bool:
    """Whether the run trains on CUDA GPUs with an engine the planner models (CPU runs need no plan)."""
    import torch

    accelerator = str(settings.get("trainer.accelerator", "auto"))
    return torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")


def reward_summary(path: Path) -> str | None:
    """``rollout/reward_mean`` over the first and the last fifth of the logged steps."""
    if not path.is_file():
        return None
    with open(path) as f:
        rewards = [float(row[REWARD_KEY]) for row in csv.DictReader(f) if row.get(REWARD_KEY)]
    if len(rewards) < 5:
        return None
    fifth = len(rewards) // 5
    first, last = statistics.fmean(rewards[:fifth]), statistics.fmean(rewards[-fifth:])
    return f"{REWARD_KEY}: first fifth {first:.3f} -> last fifth {last:.3f} ({last - first:+.3f}) over {len(rewards)} steps"


def main(args: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["plan"]:  # memory estimate from the config alone, before LightningCLI (see lit_agentrl.plan)
        from lit_agentrl.plan import plan_main

        raise SystemExit(plan_main(argv[1:]))
    AgentRLCLI(
        GRPOModule,
        AgentPromptDataModule,
        # The data module splits prompts across ranks itself; checkpoint files are written atomically; whatever a
        # run writes without a folder of its own (logs, checkpoints, the saved config) goes under outputs/.
        trainer_defaults={
            "use_distributed_sampler": False,
            "plugins": [AtomicCheckpointIO()],
            "default_root_dir": DEFAULT_ROOT_DIR,
        },
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
