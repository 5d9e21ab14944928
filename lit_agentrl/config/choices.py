"""The names each option of the model's settings accepts. The config is a leaf: it names what the training side
implements, and the training side keeps its implementations under exactly these names (tests/test_losses.py checks
that they agree)."""

from __future__ import annotations

ADVANTAGE_STDS = ("sample", "population", "none")
"""``model.loss.advantage_std``: what a group's centred rewards are divided by. ``sample``: the unbiased (n - 1) std,
as ``torch.std`` gives it (TRL, verl, OpenRLHF); ``population``: the n std (ChatLearn's ``np.std``); ``none``: not
divided, Dr. GRPO."""

SEQUENCE_REWARDS = ("shared", "own")
"""``model.loss.sequence_rewards``: how a trajectory of several token sequences is scored. ``shared``: it is one
member of its group, and each of its sequences gets its advantage; ``own``: each sequence is a member, scored by the
reward the agent gave it (``TokenSequence.reward``), else by the trajectory's."""

ADVANTAGES = ("grpo", "gigpo", "turn_returns", "gae")
"""``model.loss.advantage``: how a trajectory's rewards become the advantages of its tokens
(``lit_agentrl.training.advantage_estimators.ESTIMATORS`` holds each one's function). ``grpo``: every token gets its
trajectory's group-normalised reward; ``gigpo``: GiGPO's episode plus step advantage, a step's group being the turns of
the prompt's trajectories generated from the same context; ``turn_returns``: each turn's discounted reward-to-go,
baselined per turn index; ``gae``: generalised advantage estimation over turns with a learned critic."""

DEFAULT_GAMMAS = {"gigpo": 0.95, "turn_returns": 1.0, "gae": 1.0}
"""The discount per turn an estimator uses when ``model.loss.gamma`` is left unset: the 0.95 of GiGPO's paper (Feng
et al. 2025), and undiscounted returns for ``turn_returns`` and ``gae``. An estimator not named here has no
discount."""

STEP_GROUPS = ("group", "batch")
"""``model.loss.step_groups``: where ``gigpo`` looks for a turn's step partners (turns generated from the identical
context). ``group``: among its prompt group's trajectories, as the paper does; ``batch``: among every trajectory of
the step's rollout batch, on every data-parallel rank, for tasks whose rows share a prompt and differ in hidden state
only."""

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
"""``model.loss.aggregation``: how token losses become one loss (``lit_agentrl.training.losses.AGGREGATIONS`` holds
each one's function)."""

CORRECTIONS = ("tis", "mis")
"""``model.correction.kind``: truncated or masked importance sampling."""
LEVELS = ("token", "sequence", "geometric")
"""``model.correction.level``: where the importance ratio is taken."""
MIS_WEIGHTS = ("importance", "one")
"""``model.correction.mis_weight``: what a kept token is weighted by under ``mis``."""
