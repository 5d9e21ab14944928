"""The seed's 8-GPU run rehearsed on CPU as a GPU node runs it (docs/engines.md lists what this reaches).

Two ranks under the config's ModelParallelStrategy (FSDP2, gloo here), one in-process SGLang engine per rank started
at the same moment, colocated windows around every rollout and validation, the matheval agent on rows made by
``data/prepare_math_lighteval.py``: the fit is SIGKILLed after its first checkpoint and resumed from it to step 6,
through two validation windows, with HF exports; then ``lit-agentrl validate`` on the same config.
"""

from __future__ import annotations

import csv
import json
import time

import pytest
import yaml
from seed_run import CONFIG_8B, ONE_NODE, OUTPUTS, TWO_NODES, Layout, Run, checkpoints, lay_out, logs
from support import require_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(2400)]


def metrics(work, run: int) -> list[dict[str, str]]:
    """The rows of the ``run``-th launch's CSV (0: the killed fit, 1: the resumed one, 2: validate)."""
    path = work / OUTPUTS / "csv" / "lightning_logs" / f"version_{run}" / "metrics.csv"
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def validated(work, run: int) -> list[dict[str, str]]:
    return [r for r in metrics(work, run) if r.get("val/reward_mean")]


@pytest.mark.parametrize("layout", [ONE_NODE, TWO_NODES], ids=str)
def test_the_seed_run_killed_and_resumed_through_two_validation_windows(tmp_path, layout: Layout):
    """``1x2``: one node of 2 ranks, as the seed's node of 8. ``2x1``: 2 nodes of one rank each on this machine,
    launched as on a cluster (NODE_RANK, MASTER_ADDR; docs/engines.md shows the SLURM and torchrun commands)."""
    require_sglang()
    work = tmp_path
    config = lay_out(work)
    shipped, rehearsed = yaml.safe_load(CONFIG_8B.read_text()), yaml.safe_load(config.read_text())
    assert rehearsed["model"] == shipped["model"] and rehearsed["seed_everything"] == shipped["seed_everything"]
    assert (
        rehearsed["trainer"]["callbacks"][0]["init_args"]["reward"] == "math"
        and rehearsed["model"]["loss"]["advantage_std"] == "population"
    )

    # Fit; SIGKILL once the step-3 checkpoint is whole and the first validation window (after it) has logged.
    fit = Run(work, layout, "fit", "--config", "rehearsal.yaml")
    deadline = time.monotonic() + 1200
    while not (checkpoints(work) and validated(work, 0)) and fit.running() and time.monotonic() < deadline:
        time.sleep(1)
    assert checkpoints(work) and validated(work, 0), f"the fit ended or timed out:\n{logs(work)}"
    fit.kill()
    (first,) = checkpoints(work)
    assert "step=3" in first.name

    resumed = Run(work, layout, "fit", "--config", "rehearsal.yaml", "--ckpt_path", str(first))
    assert resumed.finish(1200) == [0] * layout.nodes, logs(work)
    kept = checkpoints(work)
    assert [p.name.split("step=")[1] for p in kept] == ["3.ckpt", "6.ckpt"]  # save_top_k: 2 by step

    before, after = metrics(work, 0), metrics(work, 1)
    trained = [r for r in before + after if r.get("train/loss")]
    steps = sorted({int(r["step"]) for r in after if r.get("train/loss")})
    assert steps == [3, 4, 5], steps  # the resumed fit trains steps 4-6 (logged at global steps 3-5)
    assert all(float(r["rollout/failed"]) == 0 for r in trained if r.get("rollout/failed"))
    assert any(float(r["rollout/response_length_mean"]) > 0 for r in trained if r.get("rollout/response_length_mean"))
    windows = validated(work, 0) + validated(work, 1)
    assert [int(r["step"]) for r in windows] == [2, 5], windows  # after steps 3 and 6, logged as the steps above
    exports = sorted(p.name for p in (work / OUTPUTS / "hf").iterdir())
    assert "step-6" in exports and "final" in exports, exports
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(work / OUTPUTS / "hf" / "final")  # loadable as a Hugging Face model

    validate = Run(work, layout, "validate", "--config", "rehearsal.yaml", "--ckpt_path", str(kept[-1]))
    assert validate.finish(900) == [0] * layout.nodes, logs(work)
    assert validated(work, 2), logs(work)
    failed = [p.name for p in work.glob("*.log") if "Traceback" in p.read_text()]
    assert not failed, logs(work)  # nothing failed on the way out either (wandb's teardown did, before)
    print(json.dumps({"checkpoints": [p.name for p in kept], "exports": exports, "windows": len(windows)}))
