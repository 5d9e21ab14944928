"""``reasoning_gym``: reasoning-gym's procedural tasks, scored by each dataset's own ``score_answer``.

``data/prepare_reasoning_gym.py`` writes the rows (any registered dataset, its own config, a seed and a size); each
row's ground truth names its entry, ``{"dataset", "config", "seed", "size", "index", "question", "answer",
"answer_tag"}``, and the reward regenerates that entry (``create_dataset(dataset, seed=, size=, **config)[index]``:
its metadata, which the scorers read, does not survive JSON) and scores the completion with the dataset's
``score_answer(answer, entry)`` in [0, 1]. The answer is what ``reasoning_gym.utils.extract_answer`` finds in the
``<answer_tag>`` tags (the last pair; no tags: 0, the dataset's score for no answer), or with ``answer_tag: null`` the
whole completion, stripped.

At setup every row's entry is regenerated and its question compared with the row's: a dataset whose generator
depends on ``PYTHONHASHSEED`` or Python's global ``random`` (reasoning-gym 0.1.25: ``isomorphic_strings``,
``ransom_note``, ``polynomial_multiplication``, ``knight_swap``, ``word_ladder``; ``list_functions`` always) is
refused there, not scored against another question. No dataset needs a download.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from lit_agentrl.agents.libraries.imports import library_problem, require
from lit_agentrl.rewards.registry import register_reward

__all__ = ["DATA_SOURCE", "GROUND_TRUTH_KEYS", "entry_rows", "reasoning_gym_reward"]

DATA_SOURCE = "reasoning_gym"  # the rows' data_source: selects the reward below
EXTRA = "reasoning-gym"
_USER = "reward 'reasoning_gym'"
GROUND_TRUTH_KEYS = ("dataset", "config", "seed", "size", "index", "question", "answer", "answer_tag")


def _reasoning_gym() -> Any:
    return require("reasoning_gym", extra=EXTRA, user=_USER)


@lru_cache(maxsize=64)
def _dataset(name: str, seed: int, size: int, config_json: str) -> Any:
    return _reasoning_gym().create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def _dataset_of(truth: Mapping[str, Any]) -> Any:
    config = json.dumps(dict(truth["config"] or {}), sort_keys=True)
    return _dataset(truth["dataset"], int(truth["seed"]), int(truth["size"]), config)


def _entry(truth: Mapping[str, Any]) -> dict[str, Any]:
    return dict(_dataset_of(truth)[int(truth["index"])])


def _score(truth: Mapping[str, Any], completion: str) -> float:
    tag = truth.get("answer_tag")
    answer = completion.strip() if tag is None else _reasoning_gym().utils.extract_answer(completion, tag_name=tag)
    dataset = _dataset_of(truth)
    return float(dataset.score_answer(answer, dict(dataset[int(truth["index"])])))


@register_reward(DATA_SOURCE)
def reasoning_gym_reward(completion: str, ground_truth: Any, **row: Any) -> float:
    """The dataset's own ``score_answer`` of the completion's answer against the row's regenerated entry."""
    return _score(ground_truth, completion)


def _check_ground_truth(truth: Any) -> str | None:
    if not isinstance(truth, Mapping) or any(k not in truth for k in GROUND_TRUTH_KEYS):
        return f"must be a mapping with the keys {list(GROUND_TRUTH_KEYS)} (data/prepare_reasoning_gym.py writes it)"
    problem = library_problem("reasoning_gym", extra=EXTRA, user=_USER)
    if problem:
        return problem
    try:
        question = _entry(truth)["question"]
    except Exception as exc:  # an unknown dataset (KeyError), a bad config key (TypeError), its validation
        return f"names a reasoning-gym entry that cannot be generated here ({type(exc).__name__}: {exc})"
    if question != truth["question"]:
        return (
            f"names reasoning-gym's {truth['dataset']!r} entry {truth['index']} (seed {truth['seed']}), which this "
            "process generates with another question: the dataset's generator depends on PYTHONHASHSEED or on "
            "Python's global random; prepare and train with the same PYTHONHASHSEED, or choose another dataset"
        )
    return None


reasoning_gym_reward.check_ground_truth = _check_ground_truth  # type: ignore[attr-defined]


def entry_rows(
    dataset: str,
    config: Mapping[str, Any],
    seed: int,
    size: int,
    *,
    agent_name: str,
    agent_cfg_path: str | None,
    system_prompt: str | None,
    answer_tag: str | None,
) -> list[dict[str, Any]]:
    """The project's rows for entries ``0..size-1`` of ``dataset`` (``data/prepare_reasoning_gym.py``)."""
    data = _dataset(dataset, seed, size, json.dumps(dict(config), sort_keys=True))
    rows = []
    for index in range(size):
        entry = data[index]
        prompt = [{"role": "system", "content": system_prompt}] if system_prompt else []
        prompt.append({"role": "user", "content": entry["question"]})
        truth = {"dataset": dataset, "config": dict(config), "seed": seed, "size": size, "index": index}
        truth |= {"question": entry["question"], "answer": entry["answer"], "answer_tag": answer_tag}
        rows.append({
            "data_source": DATA_SOURCE,
            "agent_name": agent_name,
            **({"agent_cfg_path": agent_cfg_path} if agent_cfg_path else {}),
            "prompt": prompt,
            "reward_model": {"style": "rule", "ground_truth": truth},
        })  # fmt: skip
    return rows
