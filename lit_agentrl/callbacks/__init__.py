"""Lightning callbacks of lit-agentrl."""

from lit_agentrl.callbacks.rollout import RolloutCallback

__all__ = ["RolloutCallback"]
