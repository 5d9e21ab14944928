"""Rollout correction on real rollouts: an engine sampling in bf16 against a trainer in fp32 disagree token by token,
and the correction sees it; an fp32 engine agrees with the trainer, and the correction then changes nothing."""

from __future__ import annotations

import asyncio

import pytest
import torch

from lit_agentrl.config.training import Correction, Loss
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.training.batching import collate, prepare_samples
from lit_agentrl.training.correction import correction_weights
from lit_agentrl.training.module import GRPOModule
from lit_agentrl.types import Trajectory

PROMPTS = [[5, 6, 7], [9, 10, 11, 12], [20, 21], [30, 31, 32, 33, 34]]
C = 1.001  # tight: on the tiny model bf16 moves ratios by a few 1e-3, and some must be truncated


def rollouts(model_dir: str, dtype: str) -> list[Trajectory]:
    engine = TransformersEngine(model_dir, dtype=dtype, seed=0)
    params = {"max_new_tokens": 10, "temperature": 1.0, "ignore_eos": True}

    async def all_of_them() -> list[dict]:
        requests = [p for p in PROMPTS for _ in range(2)]
        return await asyncio.gather(
            *(engine.async_generate(input_ids=p, sampling_params=params, return_logprob=True) for p in requests)
        )

    try:
        results = asyncio.run(all_of_them())
    finally:
        engine.shutdown()
    trajectories = []
    for i, result in enumerate(results):
        prompt, out = PROMPTS[i // 2], result["output_ids"]
        logprobs = [entry[0] for entry in result["meta_info"]["output_token_logprobs"]]
        trajectories.append(
            Trajectory(i // 2, i % 2, "test", prompt, prompt + out, [0] * len(prompt) + [1] * len(out), logprobs)
        )
        trajectories[-1].reward = float(i % 2)  # one success per group: every group informative
    return trajectories


def update(module: GRPOModule, trajectories: list[Trajectory]) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    samples = prepare_samples(trajectories).samples
    module.recompute_old_logprobs(samples)
    module.policy.zero_grad(set_to_none=True)
    stats = module.accumulate_gradients(samples)
    return stats, {name: p.grad.clone() for name, p in module.policy.named_parameters()}


@pytest.fixture(scope="module")
def trainer(tiny_model_dir) -> GRPOModule:
    module = GRPOModule(
        str(tiny_model_dir), loss=Loss(old_logprobs="trainer"), correction=Correction("tis", threshold=C)
    )
    module.configure_model()
    return module


def test_a_bf16_engine_against_an_fp32_trainer_is_corrected(tiny_model_dir, trainer):
    trajectories = rollouts(str(tiny_model_dir), "bfloat16")
    stats, _ = update(trainer, trajectories)
    assert stats["train/mismatch_kl"] > 1e-7 and stats["train/mismatch_ratio_max"] > C
    assert 0 < stats["train/is_clipped_frac"] < 1 and stats["train/is_weight_mean"] < C
    samples = prepare_samples(trajectories).samples
    trainer.recompute_old_logprobs(samples)
    micro = collate([[s] for s in samples], 0)
    weights, _ = correction_weights(
        micro.old_logprobs, micro.rollout_logprobs, micro.loss_mask, micro.sequence_index, "tis", threshold=C
    )
    assert float(weights.max()) == pytest.approx(C) and float(weights[micro.loss_mask > 0].min()) < 1.0


def test_an_fp32_engine_agrees_and_the_correction_changes_nothing(tiny_model_dir, trainer):
    trajectories = rollouts(str(tiny_model_dir), "float32")
    corrected_stats, corrected = update(trainer, trajectories)
    # Engine and trainer compute in other batch shapes, so their log-probs may differ in the last bits (~1e-7): KL
    # ~1e-14 (computed in float64), far below bf16's ~1e-6.
    assert corrected_stats["train/mismatch_kl"] < 1e-9 and corrected_stats["train/is_clipped_frac"] == 0.0
    correction, trainer.correction = trainer.correction, None
    try:
        _, plain = update(trainer, trajectories)
    finally:
        trainer.correction = correction
    for name, grad in plain.items():
        torch.testing.assert_close(corrected[name], grad, rtol=1e-5, atol=1e-7, msg=name)
