"""Validation metrics: the pass@k estimator, maj@k, per-data_source sums over ranks, the table, and `validate`."""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from support import REPO_ROOT, free_port, quick_config, read_csv

from lit_agentrl.callbacks.validation_report import report_table
from lit_agentrl.data import PromptBatchLoader
from lit_agentrl.rollout.evaluation import (
    PassAtK,
    extract_answer,
    extractor_name,
    maj_at_k,
    mean_at_k,
    merge,
    pass_at_k,
)
from lit_agentrl.types import Trajectory

# ---------------------------------------------------------------------------------------------- estimators


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of k-subsets of the n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_edge_cases():
    assert pass_at_k(5, 0, 1) == pass_at_k(5, 0, 5) == 0.0
    assert pass_at_k(5, 5, 1) == pass_at_k(5, 5, 5) == 1.0
    assert pass_at_k(5, 1, 5) == 1.0  # k = n: any correct sample is in the only subset
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the share correct
    # Large n stays exact where the binomials would overflow floats.
    assert pass_at_k(2000, 3, 100) == pytest.approx(1 - math.comb(1997, 100) / math.comb(2000, 100), rel=1e-9)
    for n, c, k in [(3, 1, 0), (3, 1, 4), (3, 4, 1), (3, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_mean_at_k_is_the_mean_of_all_samples():
    assert mean_at_k([1.0, 0.0, 0.2, 1.0], 1) == mean_at_k([1.0, 0.0, 0.2, 1.0], 4) == pytest.approx(0.55)
    with pytest.raises(ValueError):
        mean_at_k([1.0], 2)


def test_maj_at_k_votes_over_the_first_k_answers():
    answers, correct = ["3", "4", "4", "3", "3"], [True, False, False, True, True]
    assert maj_at_k(answers, correct, 1) == 1.0  # "3"
    assert maj_at_k(answers, correct, 3) == 0.0  # "4" twice
    assert maj_at_k(answers, correct, 4) == 1.0  # a 2-2 tie: "3" was seen first
    assert maj_at_k(answers, correct, 5) == 1.0
    assert maj_at_k([None, "7", None], [False, False, False], 3) == 0.0  # failed samples do not vote
    assert maj_at_k([None, "5", None], [False, True, False], 3) == 1.0
    assert maj_at_k([None, None], [False, False], 2) == 0.0  # no votes at all


def test_the_winning_answer_scores_by_its_first_sample():
    # The same extracted answer from two samples scored differently (say, one truncated): the first decides.
    assert maj_at_k(["1", "1", "2"], [False, True, True], 3) == 0.0


def test_answers_are_extracted_by_reward_or_data_source():
    assert extract_answer("math", "so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert extract_answer("math", "  no box  ") == "no box"  # fallback: the stripped text
    assert extract_answer("next_digit", "7<|im_end|>") == "7"
    assert extract_answer("next_digit", "7") == "7"  # not well-formed: the stripped text
    assert extract_answer(None, " anything ") == "anything"
    assert extractor_name({"data_source": "next_digit"}, None) == "next_digit"
    assert extractor_name({"data_source": "lighteval/MATH"}, None) == "math"  # the reward's data_source alias
    assert extractor_name({}, "next_digit") == "next_digit"  # the data module's default reward
    assert extractor_name({"data_source": "mine"}, None) is None


# ---------------------------------------------------------------------------------------------- accumulation


def trajectories(group: int, outputs: list[tuple[str, float]], failed: tuple[int, ...] = ()) -> list[Trajectory]:
    return [
        Trajectory(group=group, sample=i, agent_name="a", str_output=text, reward=reward, failed=i in failed)
        for i, (text, reward) in enumerate(outputs)
    ]


ROWS = [{"data_source": "next_digit"}, {"data_source": "math"}, {}]


def batch_trajectories() -> list[Trajectory]:
    ok, wrong = ("1<|im_end|>", 1.0), ("2<|im_end|>", 0.2)
    return [
        *trajectories(0, [wrong, ok, wrong, ok]),
        *trajectories(1, [("\\boxed{3}", 1.0), ("\\boxed{4}", 0.0), ("\\boxed{4}", 0.0), ("x", 1.0)], failed=(3,)),
        *trajectories(2, [("a", 0.0), ("b", 1.0), ("b", 1.0), ("c", 0.0)]),
    ]


def test_sums_per_data_source():
    metric = PassAtK([4, 1, 2])
    metric.update(ROWS, list(reversed(batch_trajectories())))  # any order: samples are sorted per prompt
    result = metric.compute()
    assert list(result.sources) == ["math", "next_digit", "unknown"]
    m = result.metrics()
    assert m["val/next_digit/pass@1"] == pytest.approx(0.5)
    assert m["val/next_digit/pass@2"] == pytest.approx(1 - 1 / 6)
    assert m["val/next_digit/maj@1"] == 0.0 and m["val/next_digit/maj@2"] == 0.0  # "2" first, then a 1-1 tie
    assert m["val/next_digit/mean@4"] == pytest.approx(0.6)
    assert m["val/math/pass@4"] == 1.0 and m["val/math/maj@4"] == 0.0  # "4" twice; the failed sample has no vote
    assert m["val/math/mean@1"] == pytest.approx(0.25)  # the failed sample's reward counts 0
    assert m["val/unknown/maj@4"] == 1.0
    assert m["val/pass@1"] == pytest.approx((0.5 + 0.25 + 0.5) / 3)
    assert m["val/maj@4"] == pytest.approx(1 / 3)


def test_too_few_samples_for_k_are_refused():
    metric = PassAtK([2])
    with pytest.raises(ValueError, match="fewer than k=2"):
        metric.update([{}], trajectories(0, [("a", 1.0)]))


def test_the_table_has_a_row_per_data_source_and_all(tmp_path):
    metric = PassAtK([1, 4])
    metric.update(ROWS, batch_trajectories())
    result = metric.compute()
    path = result.write(tmp_path / "eval", 12)
    assert path == tmp_path / "eval" / "step_000012.csv"
    rows = read_csv(path)
    assert [r["data_source"] for r in rows] == ["math", "next_digit", "unknown", "all"]
    assert [int(r["prompts"]) for r in rows] == [1, 1, 1, 3]
    assert all(float(r["samples_per_prompt"]) == 4.0 for r in rows)
    assert list(rows[0]) == [
        "data_source", "prompts", "samples_per_prompt", "pass@1", "pass@4", "maj@1", "maj@4", "mean@1", "mean@4"
    ]  # fmt: skip
    markdown = path.with_suffix(".md").read_text()
    assert markdown.splitlines()[0].startswith("| data_source | prompts |") and "| all | 3 |" in markdown


# ---------------------------------------------------------------------------------------------- ranks


def shares(rows: list[dict], per_step: int, world: int) -> list[list[dict]]:
    """Every rank's validation rows, as the data module's validation loader gives them."""
    loaders = [
        PromptBatchLoader(rows, per_step, 0, False, rank, world, "val", whole_epoch=True) for rank in range(world)
    ]
    return [[row for batch in loader for row in batch.rows] for loader in loaders]


def test_validation_over_two_ranks_covers_every_row():
    rows = [json.loads(line) for line in (REPO_ROOT / "data/quickstart/val.jsonl").read_text().splitlines()]
    for per_step in (4, 6, 10, 12):  # a partial last batch, and one smaller than a step
        parts = shares(rows, per_step, world=2)
        seen = sorted(r["extra_info"]["a"] for part in parts for r in part)
        assert seen == sorted(r["extra_info"]["a"] for r in rows), per_step
        sums = []
        for part in parts:
            metric = PassAtK([1])
            outputs = [t for g in range(len(part)) for t in trajectories(g, [("1", 1.0)])]
            metric.update(part, outputs)
            sums.append(metric.sums)
        assert merge([1], sums).overall.prompts == len(rows)


def rank_batches(rank: int) -> tuple[list[dict], list[Trajectory]]:
    """Rank 0 sees next_digit and math, rank 1 math and a source of its own."""
    rows = ROWS[:2] if rank == 0 else [ROWS[1], {"data_source": "only_rank_1"}]
    outputs = batch_trajectories()
    if rank == 1:
        outputs = [t for t in outputs if t.group >= 1]
        for t in outputs:
            t.group -= 1
    else:
        outputs = [t for t in outputs if t.group < 2]
    return rows, outputs


def gloo_worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        metric = PassAtK([1, 2, 4])
        metric.update(*rank_batches(rank))
        torch.save(metric.compute().metrics(), Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_ranks_reduce_sums_not_means(tmp_path):
    mp.spawn(gloo_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    got = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    single = PassAtK([1, 2, 4])
    for rank in range(2):
        single.update(*rank_batches(rank))
    expected = single.compute().metrics()
    assert got[0] == got[1]  # every rank logs the same figures
    assert got[0] == pytest.approx(expected)
    assert "val/only_rank_1/pass@1" in got[0]
    # 4 prompts: 2 of math (one per rank), so the overall figure weighs it twice, not as one rank's mean.
    assert got[0]["val/pass@1"] == pytest.approx((0.5 + 0.25 + 0.25 + 0.5) / 4)


# ---------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_validate_writes_pass_at_k_for_every_row(tmp_path, quickstart_model_dir, capsys):
    rows = [json.loads(line) for line in (REPO_ROOT / "data/quickstart/val.jsonl").read_text().splitlines()]
    for row in rows[:3]:
        del row["data_source"]  # scored by RolloutCallback.reward, counted as "unknown"
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = quick_config(tmp_path, quickstart_model_dir, steps=1)
    settings = yaml.safe_load(config.read_text())
    callback = settings["trainer"]["callbacks"][0]["init_args"]
    callback["validation"] = {
        "n_samples": 4,
        "sampling_params": {"max_new_tokens": 4, "temperature": 1.0},
        "pass_k": [1, 4],
    }
    callback["reward"] = "next_digit"
    settings["data"].update(val_files=str(val), val_prompts_per_step=4)  # a partial batch
    config.write_text(yaml.safe_dump(settings))
    from lit_agentrl.cli import main

    main(["validate", "--config", str(config)])
    (metrics_csv,) = (tmp_path / "logs").rglob("metrics.csv")
    (logged,) = [r for r in read_csv(metrics_csv) if r.get("val/pass@1")]
    for source in ("", "next_digit/", "unknown/"):
        for key in ("pass@1", "pass@4", "maj@1", "maj@4", "mean@1", "mean@4"):
            assert 0.0 <= float(logged[f"val/{source}{key}"]) <= 1.0, (source, key)
    assert float(logged["val/pass@4"]) >= float(logged["val/pass@1"])
    table = read_csv(metrics_csv.parent / "eval" / "step_000000.csv")
    assert {r["data_source"]: int(r["prompts"]) for r in table} == {"next_digit": 7, "unknown": 3, "all": 10}
    assert all(float(r["samples_per_prompt"]) == 4.0 for r in table)
    assert float(table[-1]["pass@1"]) == pytest.approx(float(logged["val/pass@1"]))
    printed = capsys.readouterr().out
    assert "| data_source | prompts | samples_per_prompt | pass@1 | pass@4 |" in printed
    assert "| all | 10 | 4 |" in printed


def test_the_table_goes_to_the_log_dir_to_wandb_and_to_stdout_when_validating(tmp_path, capsys):
    from unittest.mock import MagicMock

    from lightning.pytorch.loggers import WandbLogger
    from lightning.pytorch.trainer.states import TrainerFn

    metric = PassAtK([1])
    metric.update(ROWS, batch_trajectories())
    wandb = MagicMock(spec=WandbLogger, log_dir=None, save_dir=str(tmp_path / "wandb"))
    trainer = SimpleNamespace(
        loggers=[wandb], default_root_dir=str(tmp_path), global_step=7, state=SimpleNamespace(fn=TrainerFn.VALIDATING)
    )
    report_table(trainer, metric.compute())
    assert (tmp_path / "wandb" / "eval" / "step_000007.md").is_file()
    (call,) = wandb.log_table.call_args_list
    assert call.args[0] == "val/table" and call.kwargs["step"] == 7
    assert call.kwargs["columns"][:3] == ["data_source", "prompts", "samples_per_prompt"]
    assert [row[0] for row in call.kwargs["data"]] == ["math", "next_digit", "unknown", "all"]
    assert "| all | 3 | 4 |" in capsys.readouterr().out
