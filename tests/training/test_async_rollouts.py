"""RolloutCallback(async_rollouts=...): rollouts of the next steps while this one trains, with bounded staleness."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from support import REPO_ROOT, quick_config, read_csv
from transformers import AutoModelForCausalLM

from lit_agentrl.callbacks import RolloutCallback
from lit_agentrl.cli import main
from lit_agentrl.config.rollout import AsyncRollouts, EngineSettings, TrainRollouts
from lit_agentrl.errors import UserInputError
from lit_agentrl.rollout.loop import RolloutLoop
from lit_agentrl.rollout.manager import RolloutManager
from lit_agentrl.rollout.seeds import RolloutSeeds

STEPS = 5
TRAINING = REPO_ROOT / "tests" / "training"
CORRECTED = {"loss": {"old_logprobs": "trainer"}, "correction": {"kind": "tis"}}


def async_config(folder, model_dir, *, schedule=None, model=None, steps=STEPS, **rollout):
    """The quickstart's shape with the rollout callback's ``async_rollouts: schedule`` (None: sync), the final weights
    exported to ``folder/hf``."""
    folder.mkdir(parents=True, exist_ok=True)
    export = {
        "class_path": "lit_agentrl.callbacks.export.HFExportCallback",
        "init_args": {"dirpath": str(folder / "hf")},
    }
    record = {"class_path": "probes.PromptRecorder", "init_args": {"path": str(folder / "prompts.jsonl")}}
    path = quick_config(folder, model_dir, steps, [export, record], engine_kwargs={"deterministic": True})
    config = yaml.safe_load(path.read_text())
    callback = config["trainer"]["callbacks"][0]["init_args"]
    callback.update(async_rollouts=schedule, **rollout)
    config["model"].update(model or {})
    path.write_text(yaml.safe_dump(config))
    return path


def final_weights(folder):
    return AutoModelForCausalLM.from_pretrained(folder / "hf" / "final").state_dict()


def step_rows(folder):
    return [r for r in read_csv(next((folder / "logs").rglob("metrics.csv"))) if r.get("rollout/reward_mean")]


@pytest.fixture(autouse=True)
def probes_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(TRAINING))


@pytest.mark.slow
def test_async_with_nothing_ahead_trains_exactly_what_sync_trains(tmp_path, quickstart_model_dir):
    main(["fit", "--config", str(async_config(tmp_path / "sync", quickstart_model_dir))])
    config = async_config(tmp_path / "async", quickstart_model_dir, schedule={"ahead": 0})
    main(["fit", "--config", str(config)])
    a, b = final_weights(tmp_path / "sync"), final_weights(tmp_path / "async")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "sync" / "prompts.jsonl").read_text() == (tmp_path / "async" / "prompts.jsonl").read_text()
    rows = step_rows(tmp_path / "async")
    assert [float(r["rollout/staleness_max"]) for r in rows] == [0.0] * STEPS


@pytest.mark.slow
def test_one_step_ahead_trains_on_one_update_old_trajectories(tmp_path, quickstart_model_dir):
    config = async_config(tmp_path, quickstart_model_dir, schedule={"ahead": 1}, model=CORRECTED)
    main(["fit", "--config", str(config)])
    rows = step_rows(tmp_path)
    # Step 0's rollout could not start earlier; every later one ran during the step before, on weights one older.
    assert [float(r["rollout/staleness_mean"]) for r in rows] == [0.0] + [1.0] * (STEPS - 1)
    assert all(float(r["rollout/dropped_stale"]) == 0 and float(r["rollout/partial_frac"]) == 0 for r in rows)
    assert all(float(r["time/wait_rollout_s"]) >= 0 for r in rows)
    assert all(float(r["rollout/trajectories"]) == 16 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine",
    [
        {},
        # The engine in a process of its own (timing-driven admission: deterministic needs the trainer's process).
        {"engine": {"name": "transformers_process", "kwargs": {"threads": 1}}},
    ],
    ids=["in-process", "engine-process"],
)
def test_partial_rollouts_generate_two_steps_ahead_within_the_staleness_bound(tmp_path, quickstart_model_dir, engine):
    schedule = {"ahead": 2, "partial": True}
    config = async_config(tmp_path, quickstart_model_dir, schedule=schedule, model=CORRECTED, **engine)
    main(["fit", "--config", str(config)])
    rows = step_rows(tmp_path)
    assert [float(r["rollout/staleness_max"]) for r in rows][:2] == [0.0, 1.0]
    assert all(float(r["rollout/staleness_max"]) <= 2 and float(r["rollout/dropped_stale"]) == 0 for r in rows)
    assert all(0.0 <= float(r["rollout/partial_frac"]) <= 1.0 for r in rows)


@pytest.mark.timeout(900)
@pytest.mark.slow
@pytest.mark.parametrize("killed_after", [2, 4], ids=lambda n: f"killed-after-{n}-steps")
def test_sigkill_with_rollouts_in_flight_resumes_to_the_weights_of_an_unbroken_run(
    tmp_path, quickstart_model_dir, killed_after
):
    """Each checkpoint waits for the rollouts in flight and carries them whole: the resumed run trains exactly the
    trajectories the unbroken run trains, so its prompts and (with the deterministic engine) its weights are the
    same. Killed at a random moment of the step after ``killed_after`` steps have started."""

    def launch(folder, *extra):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRAINING), str(REPO_ROOT)])}
        config = folder / "config.yaml"
        args = [sys.executable, "-m", "lit_agentrl.cli", "fit", "--config", str(config), *extra]
        return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    for name in ("straight", "crashed"):
        async_config(tmp_path / name, quickstart_model_dir, schedule={"ahead": 1}, model=CORRECTED, steps=6)
        config = yaml.safe_load((tmp_path / name / "config.yaml").read_text())
        config["trainer"]["callbacks"] += [
            {
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {"dirpath": str(tmp_path / name / "ckpt"), "every_n_train_steps": 1, "save_top_k": -1},
            },
            # Each step (about 0.2 s of work) held 2 s after PromptRecorder's line: the kill below lands inside the
            # step that line announced, not several steps later on a fast machine or a slow poll.
            {"class_path": "probes.PauseEachStep", "init_args": {"seconds": 2.0}},
        ]
        config["trainer"]["enable_checkpointing"] = True
        config["model"]["loss"]["entropy_coef"] = 0.01  # a gradient every step, whatever the rewards
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(config))
    assert launch(tmp_path / "straight").wait(timeout=400) == 0
    process = launch(tmp_path / "crashed")
    prompts = tmp_path / "crashed" / "prompts.jsonl"
    deadline = time.monotonic() + 400
    while (not prompts.exists() or len(prompts.read_text().splitlines()) < killed_after) and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(random.Random(killed_after).uniform(0.0, 0.5))  # somewhere in that step
    process.send_signal(signal.SIGKILL)  # a step trains; the next one's rollout is in flight
    assert process.wait(timeout=60) == -signal.SIGKILL, "the run ended before it was killed"
    checkpoints = sorted((tmp_path / "crashed" / "ckpt").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    assert checkpoints[-1].name == f"epoch=0-step={killed_after - 1}.ckpt", "killed outside the step it waited for"
    resumed = launch(tmp_path / "crashed", "--ckpt_path", str(checkpoints[-1]))
    _, err = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, err[-3000:]

    def trained(folder):  # step -> prompts of the step finally trained (a step redone after the crash overwrites)
        records = [yaml.safe_load(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]
        return {r["step"]: r["prompts"] for r in records}

    assert trained(tmp_path / "crashed") == trained(tmp_path / "straight")
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "crashed")
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    initial = AutoModelForCausalLM.from_pretrained(quickstart_model_dir).state_dict()
    assert not all(torch.equal(a[k], initial[k]) for k in a), "training did not change the weights"


def slow_tail_data(folder):
    """The quickstart's rows through ``slow_tail_single_turn``; every other row sleeps 8 s before answering, far longer
    than the fast rows' generation even on a loaded machine."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = (REPO_ROOT / "data/quickstart/train.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    for i, row in enumerate(rows):
        row.update(agent_name="slow_tail_single_turn", tail_delay=8.0 * (i % 2))
        row["agent_cfg_path"] = str(REPO_ROOT / row["agent_cfg_path"])
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_slow_tail_is_carried_to_the_next_step_and_across_a_resume(tmp_path, quickstart_model_dir):
    folder, steps = tmp_path / "run", 4
    schedule = {"ahead": 0, "partial": True, "ready_fraction": 0.5}  # a carried group: one update old
    config_path = async_config(
        folder, quickstart_model_dir, schedule=schedule, model=CORRECTED, steps=steps, engine={"name": "transformers"}
    )
    config = yaml.safe_load(config_path.read_text())
    # Unshuffled, every step has two fast and two slow rows: it trains the fast ones and carries the slow ones.
    slow_tail = {"train_files": str(slow_tail_data(folder)), "agent_modules": [str(TRAINING / "slow_tail_agent.py")]}
    config["data"].update(shuffle=False, **slow_tail)
    config["trainer"]["enable_checkpointing"] = True
    config["trainer"]["callbacks"].append(
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(folder / "ckpt"), "every_n_train_steps": 1, "save_top_k": -1},
        }
    )
    config_path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(config_path)])

    rows = step_rows(folder)
    carried = [float(r["rollout/carried_groups"]) for r in rows]
    carried_in = [float(r["rollout/carried_in"]) for r in rows]
    assert sum(carried) > 0, "no step left a group running: the slow rows did not make a tail"
    assert carried_in == [0.0, *carried[:-1]]  # what a step leaves running, the next one trains
    assert all(float(r["rollout/staleness_max"]) <= 1 and float(r["rollout/dropped_stale"]) == 0 for r in rows)
    trained = [json.loads(line)["prompts"] for line in (folder / "prompts.jsonl").read_text().splitlines()]
    assert sum(map(len, trained)) == 4 * steps - carried[-1]  # every prompt once, but the last step's tail
    assert all(float(r["rollout/trajectories"]) == 4 * len(p) for r, p in zip(rows, trained))

    # Resume from a checkpoint taken while groups were carried: the resumed run regenerates and trains them.
    step = next(k for k, c in enumerate(carried[:-1], start=1) if c > 0)
    checkpoint = next((folder / "ckpt").glob(f"*step={step}.ckpt"))
    resumed = ["--trainer.logger.init_args.save_dir", str(tmp_path / "resumed_logs"), "--ckpt_path", str(checkpoint)]
    main(["fit", "--config", str(config_path), *resumed])
    first = [r for r in read_csv(next((tmp_path / "resumed_logs").rglob("metrics.csv"))) if r.get("rollout/carried_in")]
    assert float(first[0]["rollout/carried_in"]) == carried[step - 1]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"ahead": -1}, "ahead must be >= 0"),
        ({"ahead": 2}, "ahead=2 needs partial: true"),
        ({"ready_fraction": 0.0}, r"ready_fraction must be in \(0, 1\]"),
        ({"ready_fraction": 0.5}, "ready_fraction=0.5 carries .* it needs partial: true"),
        ({"ahead": 2, "partial": True, "max_staleness": 1}, r"below the staleness this schedule produces \(2"),
        ({"ahead": 1, "partial": True, "ready_fraction": 0.5, "max_staleness": 1}, "plus one for carried groups"),
    ],
)
def test_impossible_schedules_are_refused(kwargs, fragment):
    with pytest.raises(UserInputError, match=fragment):
        AsyncRollouts(**kwargs)


def test_the_staleness_a_schedule_produces():
    assert AsyncRollouts().staleness == 1 and AsyncRollouts(ahead=0).staleness == 0
    assert AsyncRollouts(ahead=2, partial=True).staleness == 2
    assert AsyncRollouts(ahead=1, partial=True, ready_fraction=0.5).staleness == 2  # a carried group: one more
    assert AsyncRollouts(ahead=1, max_staleness=3).dropped_beyond == 3


def test_async_rollouts_cannot_share_the_trainers_gpu():
    with pytest.raises(UserInputError, match="cannot share the trainer's GPU memory"):
        RolloutCallback(EngineSettings(colocate=True), async_rollouts=AsyncRollouts())


def test_a_checkpoints_carried_groups_are_not_dropped_silently(scripted_engine_factory, tokenizer):
    manager = RolloutManager([scripted_engine_factory([])], tokenizer)
    loop = RolloutLoop(
        manager, RolloutSeeds(0, 0), TrainRollouts(n_samples=2), schedule=AsyncRollouts(ahead=1)
    )  # no carry
    with pytest.warns(UserWarning, match=r"left 3 prompt group\(s\) running .* will not train them"):
        loop.load_state_dict({"trained_steps": 2, "carried": {"epoch": 0, "index": 1, "groups": [[0, 2], [1]]}})
    assert loop.version == 2
    loop.close()
