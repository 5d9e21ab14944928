"""``lit-agentrl``: LightningCLI over GRPOModule and AgentPromptDataModule.

    lit-agentrl fit --config configs/quickstart.yaml
    lit-agentrl validate --config configs/quickstart.yaml --ckpt_path PATH
"""

from __future__ import annotations

import os

from lightning.pytorch.cli import LightningCLI

from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.module import GRPOModule


class AgentRLCLI(LightningCLI):
    """LightningCLI with the trainer defaults GRPO needs (no automatic distributed sampler: data is split by rank)."""


def main(args: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    AgentRLCLI(
        GRPOModule,
        AgentPromptDataModule,
        trainer_defaults={"use_distributed_sampler": False},
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
