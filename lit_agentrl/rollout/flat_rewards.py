"""A loud warning when rewards carry no signal: every group's rewards equal, step after step.

GRPO learns from differences within a prompt's group; when every group is flat, every advantage is zero and the
run spends its steps on nothing, while it exits 0 and its loss curve looks calm. The usual causes are data or
configuration mistakes, so the warning names them.
"""

from __future__ import annotations

from lit_agentrl.errors import UserInputError

LIKELY_CAUSES = (
    "the rows' ground truth is missing or under a field the reward function does not read (docs/data.md)",
    "the reward function is not the one for the rows' data_source (RolloutCallback.reward, or the agent's reward_score)",
    "answers are cut off by sampling_params.max_new_tokens before they can be scored (see rollout/truncated_frac)",
    "the task is too hard or too easy for the model at this temperature (RolloutCallback.train.dynamic_sampling drops flat groups)",
)


class FlatRewardWatch:
    """Counts steps in a row whose groups were all flat (``rollout/flat_group_frac`` of 1) and says so after
    ``steps`` of them, and again after each further ``steps``.

    Args:
        steps: how many flat steps in a row make the warning (0: never warn).
    """

    def __init__(self, steps: int) -> None:
        if steps < 0:
            raise UserInputError(f"RolloutCallback.flat_reward_warn_steps must be >= 0, got {steps}")
        self.steps = steps
        self.streak = 0
        self._values: set[float] = set()

    def update(self, flat_group_frac: float, reward_min: float, reward_max: float) -> str | None:
        """Feed one step's global metrics; returns the warning when it is due."""
        if not self.steps or flat_group_frac < 1.0:
            self.streak, self._values = 0, set()
            return None
        self.streak += 1
        self._values.update((reward_min, reward_max))
        if self.streak % self.steps:
            return None
        constant = f": every reward was {reward_min:g}" if len(self._values) == 1 else ""
        causes = "".join(f"\n  - {cause}" for cause in LIKELY_CAUSES)
        return (
            f"rewards were equal within every prompt group for the last {self.streak} steps{constant}. "
            f"All advantages are zero, so the policy is not learning. Likely causes:{causes}"
        )
