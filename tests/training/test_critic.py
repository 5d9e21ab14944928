"""``model.loss.advantage: gae``: the critic reads the policy's hidden state where each turn's first token is
predicted, its values reach GAE, its lambda-returns come back as its targets, it learns them, and it is saved and
restored with the run."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import yaml
from support import FSDP_TWO_RANKS, REPO_ROOT, quick_config, read_csv, short_fit, two_turns

from lit_agentrl.config.training import Loss
from lit_agentrl.training.batching import TrainingSample, prepare_samples
from lit_agentrl.training.critic import ValueHead, fit_critic, turn_starts
from lit_agentrl.training.module import GRPOModule


def test_turn_starts_are_where_runs_of_trained_targets_begin():
    assert turn_starts([0, 1, 1, 0, 0, 1]) == [1, 5]
    assert turn_starts([1, 1, 0, 1]) == [0, 3]
    assert turn_starts([0, 0]) == []


def test_gae_takes_the_critics_values_and_returns_its_targets():
    # Two games of one group: (3, 6) won, (8, 7) lost; the critic values their turns [0.5, 0.25] and [0.5, 0.75].
    # gamma 1, lambda 0.5: won: G_2 = 1, G_1 = 0 + 0.5 * 0.25 + 0.5 * 1 = 0.625 -> A = [0.125, 0.75];
    # lost: G_2 = 0, G_1 = 0.5 * 0.75 + 0.5 * 0 = 0.375 -> A = [-0.125, -0.75]. std none: their mean is 0.
    won, lost = two_turns(0, 3, 6, 1.0), two_turns(1, 8, 7, 0.0)
    seen: list[list[int]] = []

    def values(samples: list[TrainingSample]) -> list[list[float]]:
        seen.extend(s.input_ids for s in samples)
        return [[0.5, 0.25], [0.5, 0.75]]

    prepared = prepare_samples([won, lost], "none", advantage="gae", lam=0.5, turn_values=values)
    assert seen == [[1, 2, 3, 4, 5], [1, 2, 8, 4, 5]]  # every trajectory's sample, in order
    assert won.turn_advantages == pytest.approx([0.125, 0.75]) and lost.turn_advantages == pytest.approx(
        [-0.125, -0.75]
    )
    assert prepared.value_targets == [pytest.approx([0.625, 1.0]), pytest.approx([0.375, 0.0])]
    assert prepared.samples[0].advantage == pytest.approx([0.0, 0.125, 0.0, 0.0, 0.75])
    with pytest.raises(ValueError, match="gae needs its critic's values"):
        prepare_samples([won, lost], "none", advantage="gae")


def test_the_critic_starts_at_zero_and_learns_its_targets():
    torch.manual_seed(0)
    head = ValueHead(8)
    features, targets = torch.randn(32, 8), torch.rand(32)
    assert torch.equal(head(features), torch.zeros(32))
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2)
    first = fit_critic(head, optimizer, features, targets)
    assert first["train/value_loss"] == pytest.approx(float((targets**2).mean()))
    assert first["train/value_explained_variance"] == pytest.approx(0.0, abs=1e-6)  # V = 0: G - V is G
    for _ in range(150):
        last = fit_critic(head, optimizer, features, targets)
    assert last["train/value_loss"] < 0.2 * first["train/value_loss"]
    assert last["train/value_explained_variance"] > 0.5


def test_the_critic_reads_the_hidden_state_predicting_each_turns_first_token(tiny_model_dir):
    module = GRPOModule(str(tiny_model_dir), loss=Loss(advantage="gae"))
    module.configure_model()
    assert module.critic is not None
    torch.nn.init.normal_(module.critic.layers[2].weight)  # not the zero start: values must differ by position
    vocab = module.policy.config.vocab_size
    g = torch.Generator().manual_seed(0)
    masks = [[0, 0, 1, 1, 0, 0, 1], [0, 1, 0, 1, 1], [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]]
    samples = []
    for mask in masks:
        ids = torch.randint(3, vocab, (len(mask) + 1,), generator=g).tolist()
        samples.append(TrainingSample(ids[:-1], ids[1:], mask, [0.0] * len(mask), 0.0))
    values = module._turn_values(samples)  # packed: the three samples share rows
    expected = []
    with torch.no_grad():
        for sample in samples:
            out = module.policy(input_ids=torch.tensor([sample.input_ids]), output_hidden_states=True, use_cache=False)
            hidden = out.hidden_states[-1][0, turn_starts(sample.loss_mask)]
            expected.append(module.critic(hidden.float()).tolist())
    assert [len(v) for v in values] == [2, 2, 2]
    for got, want in zip(values, expected):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_the_critic_and_its_optimizer_are_saved_and_restored(tiny_model_dir):
    module = GRPOModule(str(tiny_model_dir), loss=Loss(advantage="gae", value_lr=0.01))
    module.configure_model()
    assert module.critic is not None and module.critic_optimizer is not None
    fit_critic(module.critic, module.critic_optimizer, torch.randn(4, module.critic.hidden_size), torch.ones(4))
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    assert any(key.startswith("critic.") for key in checkpoint["state_dict"])
    again = GRPOModule(str(tiny_model_dir), loss=Loss(advantage="gae", value_lr=0.01))
    again.configure_model()
    again.load_state_dict(checkpoint["state_dict"])
    again.on_load_checkpoint(checkpoint)
    probe = torch.randn(3, module.critic.hidden_size)
    assert torch.equal(again.critic(probe), module.critic(probe))
    state, restored = module.critic_optimizer.state_dict(), again.critic_optimizer.state_dict()
    assert all(torch.equal(state["state"][k]["exp_avg"], restored["state"][k]["exp_avg"]) for k in state["state"])


def test_gae_settings_name_their_key():
    assert Loss(advantage="gae").lam == 0.95 and Loss(advantage="gae").critic_lr == 1e-3
    assert Loss(advantage="gae").discount == 1.0
    with pytest.raises(ValueError, match=r"model\.loss\.gae_lambda: 0\.5 belongs to gae's critic.*advantage is grpo"):
        Loss(gae_lambda=0.5)
    with pytest.raises(ValueError, match=r"model\.loss\.value_lr: 0\.1 belongs to gae's critic.*turn_returns"):
        Loss(advantage="turn_returns", value_lr=0.1)
    with pytest.raises(ValueError, match=r"model\.loss\.gae_lambda must be in \[0, 1\], got 2\.0"):
        Loss(advantage="gae", gae_lambda=2.0)
    with pytest.raises(ValueError, match=r"model\.loss\.value_lr must be > 0, got 0\.0"):
        Loss(advantage="gae", value_lr=0.0)


@pytest.mark.slow
def test_a_multi_turn_fit_trains_its_critic(tmp_path, quickstart_model_dir, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # the config names its data and agent YAML from the project root
    settings = yaml.safe_load((REPO_ROOT / "configs/quickstart_multiturn.yaml").read_text())
    settings["model"]["loss"] = {"advantage": "gae", "gae_lambda": 0.5}
    config = tmp_path / "gae.yaml"
    config.write_text(yaml.safe_dump(settings))
    rows = [r for r in short_fit(config, quickstart_model_dir, tmp_path / "logs", steps=3) if r.get("train/loss")]
    assert len(rows) == 3
    losses = [float(r["train/value_loss"]) for r in rows]
    assert all(math.isfinite(v) and v > 0 for v in losses)
    assert all(math.isfinite(float(r["train/grad_norm"])) for r in rows)


def test_a_step_whose_every_trajectory_failed_leaves_the_critic_alone(tiny_model_dir):
    module = GRPOModule(str(tiny_model_dir), loss=Loss(advantage="gae"))
    module.configure_model()
    assert module._turn_values([]) == [] and module._critic_features is not None and len(module._critic_features) == 0
    assert set(module._fit_critic([])) == {"train/value_loss", "time/critic_s"}
    assert module._fit_critic([]) == {}  # nothing kept since: nothing to fit


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_fsdp2_ranks_train_checkpoint_and_resume_the_critic(tmp_path, quickstart_model_dir):
    checkpoints = tmp_path / "ckpt"
    callbacks = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(checkpoints), "every_n_train_steps": 1, "save_top_k": -1},
        }
    ]
    config = quick_config(
        tmp_path, quickstart_model_dir, 2, callbacks, devices=2, strategy=FSDP_TWO_RANKS, enable_checkpointing=True
    )
    settings = yaml.safe_load(config.read_text())
    settings["model"]["loss"] = {"advantage": "gae", "gae_lambda": 0.5}
    config.write_text(yaml.safe_dump(settings))

    def fit(*extra: str) -> None:
        command = [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(config), *extra]
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=540)
        assert result.returncode == 0, result.stderr[-4000:]

    fit()
    rows = [r for r in read_csv(next((tmp_path / "logs").rglob("metrics.csv"))) if r.get("train/value_loss")]
    assert len(rows) == 2 and all(math.isfinite(float(r["train/value_loss"])) for r in rows)
    first = sorted(checkpoints.iterdir())[0]
    # A sharded checkpoint: the critic's weights are in the model's shards (a strict load of them below), its AdamW
    # in the metadata Lightning keeps beside them.
    assert torch.load(first / "meta.pt", weights_only=False)["critic_optimizer"]["state"]
    fit("--ckpt_path", str(first), "--trainer.max_steps", "3")
