"""Advantage estimators by name: one advantage per model turn, from the turns of a rollout batch's trajectories.

An :class:`Episode` is one (non-failed) trajectory seen as its model turns: each turn's anchor (the key of the exact
context it was generated in, :func:`~lit_agentrl.turns.turn_anchor`) and own reward, plus the trajectory's
outcome reward, which counts as the last turn's reward. Notation below: trajectory i of a prompt group has turns
t = 1..T_i with rewards r_t^(i) (the outcome added to r_T^(i)).

Every estimator normalises within sets of comparable values exactly as
:func:`~lit_agentrl.training.losses.grpo_advantages` does (mean-centred, over the std named by ``std``, plus 1e-6);
a set of one value gets 0. Only the values and the sets differ:

========================  =======================================  ==============================================
name                      value per turn                           compared with
========================  =======================================  ==============================================
``grpo``                  R(tau_i) = sum_t r_t^(i)                 the trajectories of its prompt group
``gigpo``                 A^E(tau_i) + omega * A^S                 A^S: turns of its group with the same anchor
``turn_returns``          R_t^(i) = sum_{k>=t} gamma^(k-t) r_k     turns of its group with the same turn index t
``gae``                   G_t^lambda - V(s_t), V a learned critic  every turn of the batch
========================  =======================================  ==============================================
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain

import torch

from lit_agentrl.config.choices import ADVANTAGE_STDS, STEP_GROUPS
from lit_agentrl.training.losses import grpo_advantages


@dataclass(frozen=True)
class Turn:
    """One model turn of a trajectory."""

    anchor: Hashable
    """Key of the exact token context the turn was generated in; equal keys within a group: the same state."""
    reward: float = 0.0
    """The turn's own reward (0.0: it has none)."""
    value: float = 0.0
    """A critic's estimate V(s) of the return from the turn's context (``gae``; 0.0 where no critic runs)."""


@dataclass(frozen=True)
class Episode:
    """A trajectory as its model turns, in order, and its outcome reward."""

    group: int
    """The prompt group (:attr:`lit_agentrl.types.Trajectory.group`)."""
    turns: tuple[Turn, ...]
    outcome: float
    """The trajectory's reward, given after its last turn."""

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError(f"an episode of group {self.group} has no model turns: leave such trajectories out")
        values = {"outcome": self.outcome, **{f"turn {i} reward": t.reward for i, t in enumerate(self.turns)}}
        bad = {name: value for name, value in values.items() if not math.isfinite(value)}
        if bad:
            raise ValueError(f"an episode of group {self.group} has non-finite rewards: {bad}")
        values = {f"turn {i} value": t.value for i, t in enumerate(self.turns) if not math.isfinite(t.value)}
        if values:
            raise ValueError(f"an episode of group {self.group} has non-finite values (its critic's): {values}")

    @property
    def rewards(self) -> list[float]:
        """r_1..r_T: each turn's own reward, the outcome added to the last turn's."""
        rewards = [t.reward for t in self.turns]
        rewards[-1] += self.outcome
        return rewards

    @property
    def total_return(self) -> float:
        """R(tau) = sum_t r_t: the outcome plus every turn reward, undiscounted."""
        return sum(self.rewards)


@dataclass(frozen=True)
class AdvantageParams:
    """What the estimators take besides the episodes; each reads only the ones its formula has."""

    std: str
    """One of :data:`~lit_agentrl.config.choices.ADVANTAGE_STDS`, as for ``grpo_advantages``."""
    gamma: float
    """Discount per turn, in [0, 1] (``gigpo``, ``turn_returns``)."""
    step_weight: float
    """GiGPO's omega >= 0, the weight of the step advantage (``gigpo``)."""
    step_groups: str = "group"
    """One of :data:`~lit_agentrl.config.choices.STEP_GROUPS`: where ``gigpo``'s step groups are formed."""
    lam: float = 1.0
    """GAE's lambda in [0, 1] (``gae``): 1 is the Monte Carlo return, 0 the one-turn temporal difference."""
    step_first_turn: bool = True
    """Whether ``gigpo``'s step advantage also credits first turns (the paper's); False leaves them A^E alone."""

    def __post_init__(self) -> None:
        if self.std not in ADVANTAGE_STDS:
            raise ValueError(f"advantage std must be one of {list(ADVANTAGE_STDS)}, got {self.std!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"advantage gamma must be in [0, 1], got {self.gamma}")
        if not (self.step_weight >= 0.0 and math.isfinite(self.step_weight)):
            raise ValueError(
                f"advantage step_weight (GiGPO's omega) must be a finite number >= 0, got {self.step_weight}"
            )
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"advantage lam (GAE's lambda) must be in [0, 1], got {self.lam}")
        if self.step_groups not in STEP_GROUPS:
            raise ValueError(f"advantage step_groups must be one of {list(STEP_GROUPS)}, got {self.step_groups!r}")


Estimator = Callable[[Sequence[Episode], AdvantageParams], list[list[float]]]
"""(episodes, params) -> advantages[i][t] for turn t of episodes[i]."""


def grpo(episodes: Sequence[Episode], params: AdvantageParams) -> list[list[float]]:
    """Today's outcome advantage: every turn of a trajectory gets its trajectory's group-normalised return.

    A_t^(i) = (R(tau_i) - mean_j R(tau_j)) / F_norm, over the trajectories j of its prompt group, with
    R(tau) = outcome + sum of turn rewards (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, Sec. 4.1.2;
    :func:`~lit_agentrl.training.losses.grpo_advantages`). GiGPO's episode advantage A^E (its Eq. 3) is this.
    """
    per_episode = group_normalised([e.total_return for e in episodes], [e.group for e in episodes], params.std)
    return [[a] * len(e.turns) for a, e in zip(per_episode, episodes)]


def gigpo(episodes: Sequence[Episode], params: AdvantageParams) -> list[list[float]]:
    """GiGPO's two-level advantage (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
    arXiv 2505.10978, Sec. 4), with a turn's anchor state being its exact token context.

    - Episode advantage (Eq. 3): A^E(tau_i) = (R(tau_i) - mean_j R(tau_j)) / F_norm, as :func:`grpo`.
    - Step groups (Eq. 4, 6): G^S(s) = the turns t of the group's trajectories i whose context s_t^(i) is s.
    - Discounted step return (Eq. 5): R_t^(i) = sum_{k=t}^{T_i} gamma^(k-t) r_k^(i), the outcome in r_T.
    - Step advantage (Eq. 7): A^S(a_t^(i)) = (R_t^(i) - mean over G^S of R) / F_norm over G^S; 0 in a group of one.
    - Combined (Eq. 8): A(a_t^(i)) = A^E(tau_i) + omega * A^S(a_t^(i)).

    F_norm is the std named by ``std`` (the paper's std, or 1: ``none``), at both levels. The paper's defaults,
    omega = 1 and gamma = 0.95, are the config's when ``step_weight`` and ``gamma`` are unset. Every first turn
    shares its group's prompt as context, so the first turns form one step group: on a single-turn task
    (gamma^0 = 1, R_1 = R(tau)) A^S = A^E, and gigpo gives (1 + omega) * grpo.

    That first step group compares what the episode group compares: with gamma 1 its A^S is a second copy of A^E,
    with gamma < 1 the first turn's discounted return, and with gamma 0 the first turn's own reward alone (in a game
    whose first move cannot win by skill, luck at weight omega). ``step_first_turn: False`` drops it: first turns
    get A^E alone, later turns A^E + omega * A^S, and a single-turn task gets exactly :func:`grpo`.

    ``step_groups: batch`` widens G^S(s) to the turns with context s in any group of the batch (the paper keeps to
    one group, whose trajectories start from one environment state). Where rows share a prompt and differ only in
    what the environment hides, the same context recurs across groups, and the step group's mean is the return
    expected from that context over the hidden states the batch holds: the Monte Carlo baseline of the observation
    history, which the policy cannot tell apart anyway.
    """
    episode = grpo(episodes, params)
    keys = _step_group_keys(episodes, params.step_groups)
    step = _per_turn([discounted_returns(e.rewards, params.gamma) for e in episodes], keys, params.std)
    if not params.step_first_turn:
        step = [[0.0, *later] for _, *later in step]
    return [[a + params.step_weight * s for a, s in zip(ea, sa)] for ea, sa in zip(episode, step)]


def turn_returns(episodes: Sequence[Episode], params: AdvantageParams) -> list[list[float]]:
    """Discounted turn returns, baselined per turn index within the group.

    A_t^(i) = (R_t^(i) - mean_{j: T_j >= t} R_t^(j)) / F_norm over the same j, with
    R_t^(i) = sum_{k=t}^{T_i} gamma^(k-t) r_k^(i) (reward-to-go, Williams 1992; the outcome in r_T).

    Why this normalisation (verl RFC 7244, github.com/verl-project/verl/issues/7244): normalising each turn's
    *reward* per turn index and then summing the normalised rewards over the remaining turns subtracts
    sum_{k=t}^{T_i} b_k, whose number of terms is the trajectory's own stopping turn T_i, decided by the very actions
    being credited: an action-dependent baseline, biased by the group's mean intermediate reward for every further
    turn taken. Pooling every turn of a group into one mean is biased too (a trajectory with more turns weighs more,
    and its own later turns enter its earlier turns' baseline). Here turn t's baseline is one number, taken over the
    trajectories that reached turn t; whether trajectory i reached t is fixed before its turn t is sampled, so the
    baseline does not depend on a_t^(i) or later actions, whatever T_i turns out to be, and each trajectory counts
    once per index. It includes i itself, as GRPO's does (a (1 - 1/n_t) shrink, no change of sign); ``none`` leaves
    out the std, whose own-sample dependence GRPO also has (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783).

    At t = 1 every trajectory of the group takes part, so on a single-turn task this is exactly :func:`grpo`.
    """
    returns = [discounted_returns(e.rewards, params.gamma) for e in episodes]
    keys: list[list[Hashable]] = [[(e.group, t) for t in range(len(e.turns))] for e in episodes]
    return _per_turn(returns, keys, params.std)


def gae(episodes: Sequence[Episode], params: AdvantageParams) -> list[list[float]]:
    """Generalised advantage estimation over turns with a learned critic (Schulman et al. 2016, "High-Dimensional
    Continuous Control Using Generalized Advantage Estimation", arXiv 1506.02438, Eq. 16), a turn being a time step.

    - TD residual: delta_t = r_t + gamma V(s_{t+1}) - V(s_t), with V(s_{T+1}) = 0 after the last turn.
    - A_t = sum_{k>=0} (gamma lambda)^k delta_{t+k} = G_t^lambda - V(s_t), G^lambda the lambda-return
      (:func:`lambda_returns`, also the critic's regression target).
    - Normalised over every turn of the batch (mean-centred, over the std named by ``std``), as PPO implementations
      whiten their advantages (verl's ``masked_whiten``).

    V(s_t) is each turn's ``value``, the critic's estimate before this step's update. lambda = 1 uses V as a baseline
    only (the return minus V); lambda < 1 bootstraps: a turn is credited with what V says its successor context is
    worth instead of the later turns' luck. On a single-turn task A = r - V(prompt), whitened: not ``grpo``.
    """
    raw = [[g - t.value for g, t in zip(episode_lambda_returns(e, params), e.turns)] for e in episodes]
    return _per_turn(raw, [[0] * len(e.turns) for e in episodes], params.std)


ESTIMATORS: dict[str, Estimator] = {"grpo": grpo, "gigpo": gigpo, "turn_returns": turn_returns, "gae": gae}
"""Advantage estimator names -> functions: a new estimator is one function and its entry here."""


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """R_t = sum_{k>=t} gamma^(k-t) r_k for each t, computed backwards: R_T = r_T, R_t = r_t + gamma * R_{t+1}."""
    returns: list[float] = []
    later = 0.0
    for reward in reversed(rewards):
        later = reward + gamma * later
        returns.append(later)
    return returns[::-1]


def lambda_returns(rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float) -> list[float]:
    """G_t^lambda for each t, computed backwards: G_t = r_t + gamma ((1 - lambda) V_{t+1} + lambda G_{t+1}), with
    G_{T+1} = V_{T+1} = 0; G_t - V_t is GAE's advantage (lambda 1: the discounted return; 0: r_t + gamma V_{t+1})."""
    returns: list[float] = []
    later_return = later_value = 0.0
    for reward, value in zip(reversed(rewards), reversed(values), strict=True):
        later_return = reward + gamma * ((1 - lam) * later_value + lam * later_return)
        later_value = value
        returns.append(later_return)
    return returns[::-1]


def episode_lambda_returns(episode: Episode, params: AdvantageParams) -> list[float]:
    """:func:`lambda_returns` of an episode's rewards and its turns' values: ``gae``'s G^lambda, also the critic's
    targets."""
    return lambda_returns(episode.rewards, [t.value for t in episode.turns], params.gamma, params.lam)


def group_normalised(values: Sequence[float], keys: Sequence[Hashable], std: str) -> list[float]:
    """Each value centred on the mean of the values sharing its key and over their std: ``grpo_advantages``."""
    if not values:
        return []
    ids: dict[Hashable, int] = {}
    index = [ids.setdefault(key, len(ids)) for key in keys]
    normalised = grpo_advantages(torch.tensor(values, dtype=torch.float64), torch.tensor(index), std=std)
    return normalised.advantages.tolist()


def step_group_sizes(episodes: Sequence[Episode], scope: str = "group") -> list[int]:
    """The size of each of GiGPO's step groups (turns sharing an anchor, within a group or the batch: ``scope``), for
    metrics: their number, and how many turns found a partner (those in groups of two or more)."""
    return list(Counter(chain.from_iterable(_step_group_keys(episodes, scope))).values())


def _step_group_keys(episodes: Sequence[Episode], scope: str) -> list[list[Hashable]]:
    if scope == "batch":
        return [[t.anchor for t in e.turns] for e in episodes]
    return [[(e.group, t.anchor) for t in e.turns] for e in episodes]


def _per_turn(values: list[list[float]], keys: list[list[Hashable]], std: str) -> list[list[float]]:
    """:func:`group_normalised` over every turn of every episode at once, back in per-episode lists."""
    flat = group_normalised(list(chain.from_iterable(values)), list(chain.from_iterable(keys)), std)
    ends = list(accumulate(len(v) for v in values))
    return [flat[end - len(v) : end] for v, end in zip(values, ends)]
