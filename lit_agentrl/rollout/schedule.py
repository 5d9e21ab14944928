"""How far rollouts run ahead of training, as one validated value (``RolloutCallback.async_rollouts``).

Three knobs decide an asynchronous schedule, and they constrain each other, so they are one value, checked together:

* ``ahead``: how many steps' rollouts run on the engine while a step trains (0: none, what sync mode trains on);
* ``partial``: whether a weight push may land while requests are in flight (they continue on the new weights); without
  it the push waits for them, so at most one step can run ahead;
* ``ready_fraction``: with ``partial``, a step trains once this fraction of its prompt groups have finished and
  carries the rest to the next step (:mod:`lit_agentrl.rollout.tail`).

The staleness a schedule produces follows from them: a rollout started ``ahead`` steps early is trained ``ahead``
updates after its first token, and a carried group one update later still. That is the one place it is decided;
``max_staleness`` (default: exactly that) is where trajectories are dropped and counted (``rollout/dropped_stale``).
"""

from __future__ import annotations

from dataclasses import dataclass

from lit_agentrl.errors import UserInputError


@dataclass(frozen=True)
class AsyncRollouts:
    """Rollouts of the coming steps generated while this one trains (``RolloutCallback.async_rollouts``).

    Args:
        ahead: steps generated ahead of the one training (0: none; without ``partial``, at most 1).
        partial: push the weights as soon as a step ends, into requests in flight (they keep the log-probs they were
            sampled with and continue on the new weights); needs engines that take weights while generating.
        ready_fraction: with ``partial``, a step trains once this fraction of its prompt groups have finished; the
            rest keep generating and are trained with the next step. 1.0 (default): every group.
        max_staleness: trajectories whose oldest tokens are more updates older than the policy are dropped and
            counted; default ``staleness``, what the schedule produces (it may not be lower).

    Example (YAML, under ``RolloutCallback``'s ``init_args``)::

        async_rollouts: {ahead: 2, partial: true, ready_fraction: 0.8}
    """

    ahead: int = 1
    partial: bool = False
    ready_fraction: float = 1.0
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        where = "RolloutCallback.async_rollouts"
        if self.ahead < 0:
            raise UserInputError(f"{where}.ahead must be >= 0, got {self.ahead}")
        if not 0.0 < self.ready_fraction <= 1.0:
            raise UserInputError(f"{where}.ready_fraction must be in (0, 1], got {self.ready_fraction}")
        if not self.partial and self.ahead > 1:
            raise UserInputError(
                f"{where}.ahead={self.ahead} needs partial: true: without it a weight push waits for the rollouts in "
                "flight, so only the next step's can run ahead",
                hint=f"set {where}.partial: true, or ahead: 1",
            )
        if self.ready_fraction < 1.0 and not self.partial:
            raise UserInputError(
                f"{where}.ready_fraction={self.ready_fraction} carries a step's unfinished groups into the next step, "
                "on newer weights: it needs partial: true",
                hint=f"set {where}.partial: true, or ready_fraction: 1.0",
            )
        if self.max_staleness is not None and self.max_staleness < self.staleness:
            raise UserInputError(
                f"{where}.max_staleness={self.max_staleness} is below the staleness this schedule produces "
                f"({self.staleness}: ahead={self.ahead}{', plus one for carried groups' if self.carries else ''}): "
                "it would drop the rollouts it runs ahead",
                hint=f"leave max_staleness unset (it defaults to {self.staleness}), or run fewer steps ahead",
            )

    @property
    def carries(self) -> bool:
        """Whether unfinished groups are carried to the next step."""
        return self.ready_fraction < 1.0

    @property
    def staleness(self) -> int:
        """The most updates a trained trajectory's oldest tokens are behind the policy, under this schedule."""
        return self.ahead + int(self.carries)

    @property
    def dropped_beyond(self) -> int:
        """Trajectories staler than this are dropped (``max_staleness``, default :attr:`staleness`)."""
        return self.staleness if self.max_staleness is None else self.max_staleness
