"""RolloutLoop without a Trainer: which rollout each step trains on, sync and ahead, seeded by place in the data."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lit_agentrl.config.rollout import AsyncRollouts, TrainRollouts
from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.engines.hf import TransformersEngine
from lit_agentrl.rollout.loop import RolloutLoop
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rollout.seeds import RolloutSeeds
from lit_agentrl.types import PromptBatch

SAMPLING = SamplingParams(max_new_tokens=3, temperature=1.0)


def rows(step: int) -> list[dict]:
    prompt = [{"role": "user", "content": f"question {step}"}]
    return [{"agent_name": "single_turn", "prompt": prompt, "ground_truth": "1", "data_source": "digits"}]


@dataclass
class Batches:
    """A data stream of one-row batches, one epoch: what ``AgentPromptDataModule.train_dataloader()`` gives the loop."""

    def batch_after(self, batch: PromptBatch, ahead: int) -> PromptBatch:
        return self.batch_at(batch.epoch, batch.index + ahead)

    def batch_at(self, epoch: int, index: int) -> PromptBatch:
        return PromptBatch(rows(index), epoch, index)

    def train_dataloader(self) -> Batches:
        return self

    def draw_extra_train_rows(self) -> list[dict]:
        raise AssertionError("no dynamic sampling here")


@pytest.fixture()
def loop_factory(tiny_model_dir, tokenizer):
    made: list[RolloutLoop] = []
    engine = TransformersEngine(str(tiny_model_dir), deterministic=True)

    def make(schedule: AsyncRollouts | None = None) -> RolloutLoop:
        manager = RolloutManager([engine], tokenizer, reward_fn="next_digit", check_template_drift=False)
        made.append(
            RolloutLoop(
                manager, RolloutSeeds(5, 0), TrainRollouts(n_samples=2, sampling_params=SAMPLING), schedule=schedule
            )
        )
        return made[-1]

    yield make
    for loop in made:
        loop.close()
    engine.shutdown()


def pushed(loop: RolloutLoop) -> None:
    """What the fleet's push does to the engine's version (the weights themselves stay: the loop never reads them)."""
    for engine in loop.manager.engines:
        engine.weight_version = loop.version


def tokens(batch: PromptBatch) -> list[list[int]]:
    assert batch.rollout is not None
    return [t.all_token_ids for t in batch.rollout.trajectories]


def test_a_steps_rollout_depends_on_its_place_in_the_data_not_on_when_it_runs(loop_factory):
    data = Batches()
    sync, ahead = loop_factory(), loop_factory(AsyncRollouts(ahead=0))
    for step in range(3):
        at_step, through_queue = data.batch_at(0, step), data.batch_at(0, step)
        sync.train(at_step, step, steps_left=3 - step, data=data)
        result = ahead.train(through_queue, step, steps_left=3 - step, data=data)
        assert tokens(at_step) == tokens(through_queue) and len(tokens(at_step)) == 2
        assert result.metrics["rollout/staleness_max"] == 0.0 and result.metrics["rollout/dropped_stale"] == 0.0
        sync.step_trained()
        ahead.step_trained()
        pushed(ahead)


def test_one_step_ahead_generates_the_next_batch_on_the_weights_before_the_update(loop_factory):
    data = Batches()
    loop = loop_factory(AsyncRollouts(ahead=1))
    first = loop.train(data.batch_at(0, 0), 0, steps_left=3, data=data)
    assert first.metrics["rollout/staleness_max"] == 0.0  # generated at its step
    assert set(loop.ahead.pending) == {(0, 1)}  # the next batch, started while this one trains
    loop.before_push()  # without partial rollouts the push waits for it: it ran on version 0
    loop.step_trained()
    pushed(loop)
    second = loop.train(data.batch_at(0, 1), 1, steps_left=2, data=data)
    assert second.metrics["rollout/staleness_max"] == 1.0 and second.metrics["rollout/dropped_stale"] == 0.0
    assert not loop.pushes_after_step and loop.version == 1


def test_the_weight_version_and_carried_groups_are_checkpointed(loop_factory):
    loop = loop_factory(AsyncRollouts(ahead=0, partial=True, ready_fraction=0.5))
    loop.load_state_dict({"trained_steps": 4, "carried": {"epoch": 0, "index": 2, "groups": [[0]]}})
    pushed(loop)
    assert loop.version == 4
    data = Batches()
    step = loop.train(data.batch_at(0, 3), 4, steps_left=1, data=data)  # the carried group is regenerated first
    assert step.metrics["rollout/carried_in"] == 1.0
    assert loop.state_dict()["trained_steps"] == 4
