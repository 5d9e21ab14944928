"""Lightning callbacks of lit-agentrl."""

from lit_agentrl.callbacks.export import HFExportCallback
from lit_agentrl.callbacks.progress import StepProgressBar
from lit_agentrl.callbacks.rollout import RolloutCallback
from lit_agentrl.callbacks.trajectory_log import TrajectoryLog

__all__ = ["HFExportCallback", "RolloutCallback", "StepProgressBar", "TrajectoryLog"]
