"""TrajectoryLog: what a line holds, which trajectories a step logs, where each rank writes, and what survives."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from lightning.pytorch.loggers import CSVLogger
from trajectory_fakes import INJECTION, FakeTrainer, step_batch, write_log

from lit_agentrl.callbacks import TrajectoryLog
from lit_agentrl.callbacks.trajectory_log import select_trajectories

DOCUMENTED_FIELDS = {
    "v", "step", "split", "rank", "batch", "group", "sample", "agent_name", "data_source", "prompt", "ground_truth",
    "messages", "str_output", "reward", "advantage", "turn_rewards", "turn_advantages", "failed", "failure_reason", "failure_traceback",
    "prompt_tokens", "generated_tokens", "total_tokens", "num_turns", "num_model_turns", "num_tool_calls",
    "truncated", "seconds", "extra", "other_sequences", "token_ids", "tokens", "loss_mask", "logprobs",
}  # fmt: skip


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_select_keeps_whole_groups_then_adds_failures(tokenizer):
    trajectories = step_batch(tokenizer, 0).rollout.trajectories  # 4 groups x 4, failure at group 1 sample 0
    key = [(t.group, t.sample) for t in select_trajectories(trajectories, 6, max_failed=4)]
    assert key == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]  # group 1 does not fit: only its failure joins
    assert [(t.group, t.sample) for t in select_trajectories(trajectories, 6, max_failed=0)] == key[:4]
    assert len(select_trajectories(trajectories, 8, max_failed=4)) == 8  # groups 0 and 1, failure included
    assert [(t.group, t.sample) for t in select_trajectories(trajectories, 3, 4)] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [(t.group, t.sample) for t in select_trajectories(trajectories, 0, 4)] == [(1, 0)]
    assert len(select_trajectories(trajectories, None, 0)) == 16
    assert select_trajectories(trajectories, 6, 4) == select_trajectories(list(trajectories), 6, 4)  # deterministic


def test_a_line_holds_every_documented_field(tmp_path, tiny_model_dir, tokenizer):
    log = TrajectoryLog(max_per_step=None)
    write_log(log, FakeTrainer(tmp_path), tiny_model_dir, tokenizer, steps=1)
    lines = read_lines(tmp_path / "trajectories" / "rank0.jsonl")
    assert len(lines) == 16 and all(set(line) == DOCUMENTED_FIELDS for line in lines)
    ok = next(r for r in lines if r["group"] == 0 and r["sample"] == 1)
    assert ok["prompt"] == [{"role": "user", "content": "What is 0 + ?"}] and ok["ground_truth"] == "0"
    assert (ok["agent_name"], ok["data_source"], ok["split"], ok["step"]) == ("single_turn", "tools", "train", 0)
    assert ok["reward"] == 1.0 and ok["advantage"] == 0.5
    assert (
        len(ok["tokens"]) == len(ok["token_ids"]) == len(ok["loss_mask"]) == len(ok["logprobs"]) == ok["total_tokens"]
    )
    assert "".join(ok["tokens"]) == tokenizer.decode(ok["token_ids"])
    assert ok["prompt_tokens"] + ok["generated_tokens"] == ok["total_tokens"]
    assert ok["logprobs"][: ok["prompt_tokens"]] == [None] * ok["prompt_tokens"]
    assert ok["logprobs"][ok["prompt_tokens"] :] == [-0.5 * (i % 4) for i in range(ok["generated_tokens"])]
    tool = next(r for r in lines if r["group"] == 2)
    assert tool["num_tool_calls"] == 1 and tool["messages"][2]["tool_calls"][0]["function"]["name"] == "calc"
    assert None in tool["logprobs"][tool["prompt_tokens"] :]  # the tool's output is not generated
    assert tool["extra"] == {"finish_reason": {"type": "stop"}, "metrics": {"solved": 1.0}}
    failed = next(r for r in lines if r["failed"])
    assert failed["advantage"] is None and failed["failure_traceback"].endswith("ValueError: the agent broke")
    assert next(r for r in lines if r["group"] == 3 and r["sample"] == 0)["str_output"] == INJECTION


def test_without_tokens_a_line_has_no_token_fields(tmp_path, tiny_model_dir, tokenizer):
    write_log(TrajectoryLog(log_tokens=False), FakeTrainer(tmp_path), tiny_model_dir, tokenizer, steps=1)
    lines = read_lines(tmp_path / "trajectories" / "rank0.jsonl")
    assert lines and all(set(r) == DOCUMENTED_FIELDS - {"token_ids", "tokens", "loss_mask", "logprobs"} for r in lines)


def test_size_is_bounded_by_steps_and_per_step_sample(tmp_path, tiny_model_dir, tokenizer):
    log = TrajectoryLog(every_n_steps=2, max_per_step=4, max_failed_per_step=1)
    write_log(log, FakeTrainer(tmp_path), tiny_model_dir, tokenizer, steps=5)
    lines = read_lines(tmp_path / "trajectories" / "rank0.jsonl")
    by_step = {s: [r for r in lines if r["step"] == s] for s in {r["step"] for r in lines}}
    assert sorted(by_step) == [0, 2, 4]
    for records in by_step.values():  # group 0 whole, plus group 1's failure
        assert [(r["group"], r["sample"]) for r in records] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]


def test_each_rank_writes_its_own_file_in_rank_zeros_folder(tmp_path, tiny_model_dir, tokenizer):
    for rank in (0, 1):  # rank 1's broadcast returns rank 0's folder
        write_log(TrajectoryLog(max_per_step=4), FakeTrainer(tmp_path, rank=rank), tiny_model_dir, tokenizer, steps=1)
    files = sorted(p.name for p in (tmp_path / "trajectories").iterdir())
    assert files == ["rank0.jsonl", "rank1.jsonl"]
    for rank in (0, 1):
        assert {r["rank"] for r in read_lines(tmp_path / "trajectories" / f"rank{rank}.jsonl")} == {rank}


def test_a_resumed_run_appends(tmp_path, tiny_model_dir, tokenizer):
    write_log(TrajectoryLog(max_per_step=4), FakeTrainer(tmp_path), tiny_model_dir, tokenizer, steps=2)
    write_log(TrajectoryLog(max_per_step=4), FakeTrainer(tmp_path), tiny_model_dir, tokenizer, steps=3)
    steps = [r["step"] for r in read_lines(tmp_path / "trajectories" / "rank0.jsonl")]
    assert steps == [0] * 5 + [1] * 5 + [0] * 5 + [1] * 5 + [2] * 5  # the viewer keeps the last of each


def test_validation_is_logged_with_its_split_and_bounded_per_run(tmp_path, tiny_model_dir, tokenizer):
    log = TrajectoryLog(max_per_step=6, max_failed_per_step=1)
    write_log(log, FakeTrainer(tmp_path, step=3), tiny_model_dir, tokenizer, steps=0, val=True)
    lines = read_lines(tmp_path / "trajectories" / "rank0.jsonl")
    assert {r["split"] for r in lines} == {"val"} and all(r["advantage"] is None for r in lines)
    # batch 0: group 0 (4) and group 1's failure; batch 1: room for one, then its failure
    expected = [(0, 0, s) for s in range(4)] + [(0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert [(r["batch"], r["group"], r["sample"]) for r in lines] == expected


def test_sanity_check_validation_is_not_logged(tmp_path, tiny_model_dir, tokenizer):
    trainer = FakeTrainer(tmp_path)
    trainer.sanity_checking = True
    write_log(TrajectoryLog(), trainer, tiny_model_dir, tokenizer, steps=0, val=True)
    assert not (tmp_path / "trajectories" / "rank0.jsonl").exists()


def test_csv_logger_gets_a_text_page_per_logged_step(tmp_path, tiny_model_dir, tokenizer):
    logger = CSVLogger(save_dir=str(tmp_path), name="csv")
    write_log(TrajectoryLog(max_per_step=4), FakeTrainer(tmp_path, [logger]), tiny_model_dir, tokenizer, steps=2)
    run = Path(logger.log_dir)
    assert (run / "trajectories" / "rank0.jsonl").is_file()  # the logger's folder is the run's
    pages = sorted((run / "samples").iterdir())
    assert [p.name for p in pages] == ["step_000000.txt", "step_000001.txt"]
    text = pages[0].read_text()
    assert "the answer is 0" in text and "FAILED: ValueError: the agent broke" in text and "What is 0 + ?" in text


def test_wandb_gets_a_samples_table(tmp_path, tiny_model_dir, tokenizer, monkeypatch):
    from lightning.pytorch.loggers import WandbLogger

    from lit_agentrl.viewer.records import TABLE_COLUMNS

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-files"))
    logger = WandbLogger(save_dir=str(tmp_path / "wandb-files"), offline=True, project="lit-agentrl-test")
    try:
        write_log(TrajectoryLog(max_per_step=4), FakeTrainer(tmp_path, [logger]), tiny_model_dir, tokenizer, steps=2)
        run_dir = Path(logger.experiment.dir).parent
    finally:
        logger.experiment.finish()
    assert len(read_lines(run_dir / "trajectories" / "rank0.jsonl")) == 10  # in the run's own folder
    tables = sorted((run_dir / "files" / "media" / "table" / "rollout").glob("samples_*.table.json"))
    assert len(tables) == 2
    table = json.loads(tables[0].read_text())
    assert table["columns"] == TABLE_COLUMNS and len(table["data"]) == 5
    assert table["data"][0][:4] == [0, "single_turn", "tools", "user: What is 0 + ?"]


def test_lines_of_finished_steps_survive_a_sigkill(tmp_path, tiny_model_dir):
    script = textwrap.dedent(f"""
        import os, signal, sys
        from types import SimpleNamespace
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from transformers import AutoTokenizer
        from trajectory_fakes import FakeTrainer, step_batch
        from lit_agentrl.callbacks import TrajectoryLog
        tokenizer = AutoTokenizer.from_pretrained({str(tiny_model_dir)!r})
        trainer, module, log = FakeTrainer({str(tmp_path)!r}), SimpleNamespace(model_path={str(tiny_model_dir)!r}), TrajectoryLog()
        log.setup(trainer, module, "fit")
        for step in range(3):
            trainer.step = step
            log.on_train_batch_end(trainer, module, None, step_batch(tokenizer, step), step)
        os.kill(os.getpid(), signal.SIGKILL)  # no teardown, no exit handlers
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    steps = [r["step"] for r in read_lines(tmp_path / "trajectories" / "rank0.jsonl")]  # every line parses
    assert steps[:32] == [0] * 16 + [1] * 16  # up to the step before the last, whatever the last got to


@pytest.mark.slow
def test_a_fit_logs_trained_and_validation_trajectories(tmp_path, quickstart_model_dir):
    from support import quick_config

    from lit_agentrl.cli import main
    from lit_agentrl.viewer.cli import view_main

    callback = {"class_path": "lit_agentrl.callbacks.TrajectoryLog", "init_args": {"max_per_step": 8}}
    config = quick_config(
        tmp_path,
        quickstart_model_dir,
        steps=2,
        callbacks=[callback],
        val_check_interval=2,
        check_val_every_n_epoch=None,
    )
    main(["fit", "--config", str(config)])
    log = next((tmp_path / "logs").rglob("trajectories/rank0.jsonl"))
    lines = read_lines(log)
    train = [r for r in lines if r["split"] == "train"]
    assert [r["step"] for r in train] == [0] * 8 + [1] * 8  # two whole groups of 4 per step
    assert all(r["advantage"] is not None for r in train if not r["failed"])
    assert all(r["data_source"] == "next_digit" and r["tokens"] for r in train)
    val = [r for r in lines if r["split"] == "val"]
    assert len(val) == 8 and {r["step"] for r in val} == {1}  # 10 prompts x 1 sample, max_per_step 8
    assert (log.parent.parent / "samples" / "step_000001.txt").is_file()
    assert view_main([str(tmp_path / "logs"), "--out", str(tmp_path / "view.html")]) == 0
    assert "rollout/reward_mean" in (tmp_path / "view.html").read_text()  # its curves came from metrics.csv
