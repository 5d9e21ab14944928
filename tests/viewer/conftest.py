"""The viewer's tests build their pages from logs the real TrajectoryLog wrote, with tests/callbacks' fakes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "callbacks"))  # trajectory_fakes

METRICS_CSV = """epoch,rollout/reward_mean,rollout/response_length_mean,step,val/accuracy
0,0.25,5.0,0,
0,0.5,4.0,1,
0,0.75,3.5,2,
0,,,2,0.6
"""


@pytest.fixture()
def logged_run(tmp_path, tiny_model_dir, tokenizer) -> Path:
    """A run folder as a CSVLogger leaves it: 3 steps of 16 trajectories, a validation run, and metrics.csv."""
    from trajectory_fakes import FakeTrainer, write_log

    from lit_agentrl.callbacks import TrajectoryLog

    run = tmp_path / "logs" / "csv" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(METRICS_CSV)
    log = TrajectoryLog(max_per_step=None, max_failed_per_step=0, dirpath=str(run))
    write_log(log, FakeTrainer(run, step=0), tiny_model_dir, tokenizer, steps=3, val=True)
    return run
