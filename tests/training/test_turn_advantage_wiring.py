"""``model.loss.advantage``: a turn-level estimator's advantages reach the tokens of their turns (and nothing else),
from the trajectories as the rollout hands them over, through ``prepare_samples`` and ``collate`` to the loss."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from support import REPO_ROOT, short_fit, two_turns

from lit_agentrl.config import choices
from lit_agentrl.config.training import Loss
from lit_agentrl.training.advantage_estimators import ESTIMATORS
from lit_agentrl.training.batching import collate, prepare_samples
from lit_agentrl.types import TokenSequence, Trajectory


def test_gigpo_gives_each_turn_its_own_advantage_on_its_tokens_only():
    # Both first turns come from the prompt: one step group, returns 1 and 0 (A^S = +-0.5); the second turns follow
    # different first tokens (3, 8): two step groups of one (A^S = 0). A^E = +-0.5 (rewards 1 and 0, std none).
    won, lost = two_turns(0, 3, 6, 1.0), two_turns(1, 8, 7, 0.0)
    prepared = prepare_samples([won, lost], "none", advantage="gigpo")
    assert won.turn_advantages == [1.0, 0.5] and lost.turn_advantages == [-1.0, -0.5]
    first, second = prepared.samples
    # targets are ids[1:]: target j is position j + 1; the turns are positions 2 and 5
    assert first.advantage == [0.0, 1.0, 0.0, 0.0, 0.5] and first.loss_mask == [0, 1, 0, 0, 1]
    assert second.advantage == [0.0, -1.0, 0.0, 0.0, -0.5]
    assert prepared.turn_metrics == {
        "train/step_groups": 3.0,  # the first turns together, the second turns apart
        "train/partnered_turns": 0.5,
        "train/turn_1/advantage_std": 1.0,  # +-1
        "train/turn_1/reward_mean": 0.0,  # no turn rewards: the outcome is left out
        "train/turn_2/advantage_std": 0.5,  # +-0.5
        "train/turn_2/reward_mean": 0.0,
    }
    batch = collate([[first], [second]], pad_id=0)
    assert batch.advantages.tolist() == [[0.0, 1.0, 0.0, 0.0, 0.5], [0.0, -1.0, 0.0, 0.0, -0.5]]


def test_batch_step_groups_reach_the_tokens_across_prompt_groups():
    # Two groups of one prompt, one game each: no episode signal (groups of one), but both first turns come from
    # the prompt's context: with step_groups: batch they form one step group, returns 1 and 0 -> +-0.5.
    won, lost = two_turns(0, 3, 6, 1.0), two_turns(0, 8, 7, 0.0)
    lost.group = 1
    prepared = prepare_samples([won, lost], "none", advantage="gigpo", gamma=1.0, step_groups="batch")
    assert won.turn_advantages == [0.5, 0.0] and lost.turn_advantages == [-0.5, 0.0]
    assert prepared.turn_metrics["train/step_groups"] == 3.0 and prepared.turn_metrics["train/partnered_turns"] == 0.5
    assert prepare_samples([won, lost], "none", advantage="gigpo", gamma=1.0).turn_metrics["train/step_groups"] == 4.0
    # Without the first turns' step advantage, nothing is left to them (groups of one have no A^E).
    prepare_samples([won, lost], "none", advantage="gigpo", gamma=1.0, step_groups="batch", step_first_turn=False)
    assert won.turn_advantages == [0.0, 0.0] and lost.turn_advantages == [0.0, 0.0]


def test_a_turns_context_holds_its_images_pixels():
    # The same tokens [1, 2, image, first, 4, 5, second] in both games, the image's placeholder id 9 (merge 2: a
    # 1 x 2 x 2 grid is one placeholder), rewards 1 and 0, std none. Equal pictures: each turn index shares its
    # context, a step group (A^S +-0.5 on A^E +-0.5). Different pictures (the rows' own images, or batch step groups
    # over rows that share a text prompt): every turn is alone (A^S 0).
    def shown(pixels: float) -> Trajectory:
        game = two_turns(0, 3, 6, 1.0)
        game.prompt_ids, game.all_token_ids = [1, 2, 9], [1, 2, 9, 3, 4, 5, 6]
        game.loss_mask = [0, 0, 0, 1, 0, 0, 1]
        game.multi_modal_inputs = {"image_grid_thw": [[1, 2, 2]], "pixel_values": torch.full((4, 3), pixels)}
        return game

    won, lost = shown(0.5), shown(0.5)
    lost.sample, lost.reward = 1, 0.0
    prepare_samples([won, lost], "none", advantage="gigpo", gamma=1.0, vision=(9, 2))
    assert won.turn_advantages == [1.0, 1.0] and lost.turn_advantages == [-1.0, -1.0]
    lost.multi_modal_inputs["pixel_values"] = torch.full((4, 3), 0.25)
    prepare_samples([won, lost], "none", advantage="gigpo", gamma=1.0, vision=(9, 2))
    assert won.turn_advantages == [0.5, 0.5] and lost.turn_advantages == [-0.5, -0.5]
    with pytest.raises(ValueError, match=r"agent\(s\) \['two_turns'\] returned images, and the policy is no vision"):
        prepare_samples([won, lost], "none", advantage="gigpo")


def test_turn_returns_and_grpo_agree_where_the_turn_structure_adds_nothing():
    # Rewards only at the end, gamma 1: every turn's return is the trajectory's reward, and every turn index is
    # reached by both trajectories: turn_returns gives grpo's advantage to every turn.
    won, lost = two_turns(0, 3, 6, 1.0), two_turns(1, 8, 7, 0.0)
    grpo = prepare_samples([won, lost], "sample")
    turns = prepare_samples([won, lost], "sample", advantage="turn_returns", gamma=1.0, step_weight=1.0)
    assert [s.advantage for s in grpo.samples] == pytest.approx([0.7071, -0.7071], abs=1e-4)
    for g, t in zip(grpo.samples, turns.samples):
        assert isinstance(t.advantage, list) and isinstance(g.advantage, float)
        assert [a for a, m in zip(t.advantage, t.loss_mask) if m] == pytest.approx([g.advantage] * 2)
    assert grpo.num_flat_groups == turns.num_flat_groups == 0


def test_a_flat_group_counts_and_failed_trajectories_stay_out():
    a, b = two_turns(0, 3, 6, 1.0), two_turns(1, 3, 6, 1.0)  # the same play, the same reward: no signal
    failed = Trajectory(group=0, sample=2, agent_name="two_turns", failed=True, failure_reason="timeout")
    prepared = prepare_samples([a, b, failed], "sample", advantage="gigpo", gamma=1.0, step_weight=1.0)
    assert (prepared.num_groups, prepared.num_flat_groups, prepared.num_failed) == (1, 1, 1)
    assert len(prepared.samples) == 2 and failed.turn_advantages is None


def test_trajectories_of_several_sequences_are_refused_by_a_turn_level_estimator():
    several = two_turns(0, 3, 6, 1.0)
    several.other_sequences = [TokenSequence([1], [1, 9], [0, 1], [-0.1])]
    with pytest.raises(ValueError, match=r"agent\(s\) \['two_turns'\] .* use model\.loss\.advantage: grpo"):
        prepare_samples([several, two_turns(1, 3, 6, 0.0)], "sample", advantage="gigpo", gamma=1.0, step_weight=1.0)


def test_the_names_agree_and_bad_settings_name_their_key():
    assert tuple(ESTIMATORS) == choices.ADVANTAGES
    with pytest.raises(
        ValueError, match=r"model\.loss\.advantage must be one of \['grpo', 'gigpo', 'turn_returns', 'gae'\]"
    ):
        Loss(advantage="ppo")
    with pytest.raises(ValueError, match=r"model\.loss\.gamma must be in \[0, 1\]"):
        Loss(advantage="gigpo", gamma=1.5)
    with pytest.raises(ValueError, match=r"policy_ratio: sequence \(GSPO\) .* use advantage: grpo"):
        Loss(advantage="gigpo", policy_ratio="sequence", aggregation="seq-mean-token-mean")
    with pytest.raises(ValueError, match=r"sequence_rewards: own .* model\.loss\.advantage: turn_returns"):
        Loss(advantage="turn_returns", sequence_rewards="own")
    with pytest.raises(ValueError, match=r"model\.loss\.step_groups: batch .*advantage is grpo: set advantage: gigpo"):
        Loss(step_groups="batch")
    with pytest.raises(ValueError, match=r"model\.loss\.step_groups must be one of \['group', 'batch'\]"):
        Loss(advantage="gigpo", step_groups="prompt")
    # A setting the chosen estimator would ignore is refused, not silently dropped.
    with pytest.raises(ValueError, match=r"model\.loss\.gamma: 0\.9 discounts .*advantage is grpo.*drop gamma"):
        Loss(gamma=0.9)
    with pytest.raises(
        ValueError, match=r"model\.loss\.step_weight: 2\.0 .*advantage is turn_returns: set advantage: gigpo"
    ):
        Loss(advantage="turn_returns", step_weight=2.0)
    with pytest.raises(ValueError, match=r"model\.loss\.gamma: 1\.0 discounts .*advantage is grpo"):
        Loss(gamma=1.0)  # set is set: even the value the estimator would have used is not silently dropped
    with pytest.raises(ValueError, match=r"model\.loss\.step_weight: 1\.0 .*advantage is grpo: set advantage: gigpo"):
        Loss(step_weight=1.0)
    with pytest.raises(
        ValueError, match=r"model\.loss\.step_first_turn: False .*advantage is gae: set advantage: gigpo"
    ):
        Loss(advantage="gae", step_first_turn=False)
    with pytest.raises(ValueError, match=r"model\.loss\.step_first_turn must be true or false, got 'no'"):
        Loss(advantage="gigpo", step_first_turn="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"model\.loss\.step_first_turn must be true or false, got 0"):
        Loss(advantage="gigpo", step_first_turn=0)  # type: ignore[arg-type]  # equal to False, but not a bool
    assert (
        Loss(advantage="gigpo").first_turn_steps and not Loss(advantage="gigpo", step_first_turn=False).first_turn_steps
    )
    assert Loss(advantage="turn_returns", gamma=0.0).discount == 0.0


def test_an_unset_gamma_is_the_chosen_estimators_own():
    # GiGPO's paper discounts its step returns by 0.95; reward-to-go is undiscounted; grpo has no discount.
    assert Loss(advantage="gigpo").discount == 0.95 and Loss(advantage="gigpo").omega == 1.0
    assert Loss(advantage="turn_returns").discount == 1.0
    assert Loss().discount == 1.0
    assert Loss(advantage="gigpo", gamma=1.0, step_weight=0.5).discount == 1.0
    assert Loss(advantage="gigpo", gamma=1.0, step_weight=0.5).omega == 0.5
    with pytest.raises(ValueError, match=r"model\.loss\.step_weight must be >= 0, got -1\.0"):
        Loss(advantage="gigpo", step_weight=-1.0)


def test_the_cli_hands_every_estimator_setting_to_prepare_samples(tiny_model_dir, monkeypatch):
    from lit_agentrl.cli import build_cli
    from lit_agentrl.training import module as module_file

    class Called(Exception):
        pass

    def capture(*args, **kwargs):
        raise Called(kwargs)

    monkeypatch.setattr(module_file, "prepare_samples", capture)
    settings = ["--model.loss.advantage", "gigpo", "--model.loss.gamma", "0", "--model.loss.step_weight", "0.5"]
    settings += ["--model.loss.step_groups", "group", "--model.loss.step_first_turn", "false"]
    settings += ["--model.model_path", str(tiny_model_dir)]
    cli = build_cli(
        ["--config", str(REPO_ROOT / "configs/quickstart_multiturn.yaml"), *settings, "--trainer.logger", "false"],
        run=False,
    )
    cli.model.configure_model()
    rollout = type("Rollout", (), {"trajectories": [], "temperature": 1.0})()
    with pytest.raises(Called) as called:
        cli.model.training_step(type("Batch", (), {"rollout": rollout})(), 0)
    passed = called.value.args[0]
    assert passed["advantage"] == "gigpo" and passed["gamma"] == 0.0 and passed["step_weight"] == 0.5
    assert passed["step_groups"] == "group" and passed["step_first_turn"] is False


@pytest.mark.slow
def test_a_multi_turn_fit_trains_with_gigpo_and_logs_its_step_groups(tmp_path, quickstart_model_dir, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # the config names its data and agent YAML from the project root
    settings = yaml.safe_load((REPO_ROOT / "configs/quickstart_multiturn.yaml").read_text())
    settings["model"]["loss"] = {"advantage": "gigpo"}  # gamma and step_weight unset: the paper's
    config = tmp_path / "gigpo.yaml"
    config.write_text(yaml.safe_dump(settings))
    rows = [r for r in short_fit(config, quickstart_model_dir, tmp_path / "logs", steps=2) if r.get("train/loss")]
    assert len(rows) == 2
    for row in rows:
        # 16 prompts x 8 games of up to 3 guesses: a group's first guesses share its prompt (16 step groups of 8
        # partners); later ones pair up only where two games guessed alike so far
        assert 16 <= float(row["train/step_groups"]) <= 16 + 2 * 128 and float(row["train/partnered_turns"]) >= 1 / 3
        assert math.isfinite(float(row["train/loss"])) and float(row["train/grad_norm"]) > 0
