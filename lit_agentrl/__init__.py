"""lit-agentrl: agentic reinforcement learning (GRPO) for language models in PyTorch Lightning."""

__version__ = "0.1.0"
