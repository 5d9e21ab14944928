"""RolloutStep without a Trainer: one training step's rollout side (generate, check, push) driven by hand, as
``RolloutCallback`` drives it from Lightning's hooks."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_agentrl.config.rollout import TrainRollouts, ValidationRollouts
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.rollout.fleet import EngineFleet
from lit_agentrl.rollout.health import RolloutHealth
from lit_agentrl.rollout.loop import RolloutLoop
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rollout.metrics import RolloutMetrics
from lit_agentrl.rollout.seeds import RolloutSeeds
from lit_agentrl.rollout.step import RolloutStep
from lit_agentrl.types import PromptBatch

CPU = torch.device("cpu")


def batch(index: int) -> PromptBatch:
    prompt = [{"role": "user", "content": f"question {index}"}]
    row = {"agent_name": "single_turn", "prompt": prompt, "ground_truth": "1", "data_source": "digits"}
    return PromptBatch([row, dict(row)], 0, index)


@pytest.fixture()
def step_and_policy(tiny_model_dir, tokenizer):
    engine = TransformersEngine(str(tiny_model_dir), deterministic=True)
    manager = RolloutManager([engine], tokenizer, reward_fn="next_digit", check_template_drift=False)
    train = TrainRollouts(n_samples=3, sampling_params={"max_new_tokens": 3, "temperature": 1.0})
    validation = ValidationRollouts(n_samples=2, sampling_params={"max_new_tokens": 3, "temperature": 0.0})
    loop = RolloutLoop(manager, RolloutSeeds(1, 0), train, validation)
    health = RolloutHealth(max_failed_fraction=0.5, flat_reward_warn_steps=0)
    step = RolloutStep(loop, EngineFleet([engine]), health, RolloutMetrics(measures_drift=False), colocate=False)
    yield step, AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    step.close()


def test_a_step_generates_checks_and_pushes_without_a_trainer(step_and_policy):
    step, policy = step_and_policy
    first = batch(0)
    logged = first_logged = step.before_update(first, step=0, steps_left=2, data=None, device=CPU, policy=policy)
    assert first.rollout is not None and len(first.rollout.trajectories) == 6  # 2 prompts x n_samples 3
    assert {"rollout/reward_mean", "time/rollout_s", "time/reward_s"} <= set(logged)
    assert "time/sync_s" not in logged  # the engines start at the policy's weights: nothing to push
    assert "time/step_s" not in logged  # no step before it
    assert step.health.totals["rollouts"] == 1 and step.health.totals["trajectories"] == 6

    with torch.no_grad():  # the update
        next(policy.parameters()).add_(0.5)
    pushed = step.after_update(CPU, policy)
    assert "time/sync_s" in pushed and step.loop.version == 1 and step.health.totals["syncs"] == 1
    weights = sum(p.numel() * p.element_size() for p in policy.parameters())  # float32 engine, float32 policy
    assert pushed["sync/bytes"] == weights
    (engine,) = step.fleet.engines
    assert engine.weight_version == 1 and not step.fleet.stale

    second = batch(1)
    logged = step.before_update(second, step=1, steps_left=1, data=None, device=CPU, policy=policy)
    assert second.rollout is not None
    assert logged["time/step_s"] > first_logged["time/rollout_s"] + pushed["time/sync_s"]  # the first step, whole
    assert all(t.weight_versions == (1, 1) for t in second.rollout.trajectories)


def test_validation_uses_its_own_samples_and_sampling(step_and_policy):
    step, policy = step_and_policy
    val = batch(0)
    step.validate(val, step=0, batch_idx=0, device=CPU, policy=policy)
    assert val.rollout is not None and len(val.rollout.trajectories) == 4  # 2 prompts x validation.n_samples 2
    assert val.rollout.temperature == 0.0
