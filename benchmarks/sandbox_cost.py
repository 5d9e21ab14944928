"""What one sandboxed ``run("print(1)")`` costs: the median of many runs, for one or more checkouts side by side.

Each checkout's ``PythonSandbox`` runs in a process of its own (``PYTHONPATH`` set to the checkout), and the
checkouts take turns in rounds of 5 runs, so a change in the machine's load falls on all of them alike. The
first run of each (the probe) is not counted.

    python benchmarks/sandbox_cost.py --runs 50 . /tmp/sandbox-baseline

prints, for each checkout, the median, the 10th and the 90th percentile in milliseconds, and each checkout's
median over the first one's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = """
import json, sys, time
from lit_agentrl.tools.sandbox import PythonSandbox
sandbox = PythonSandbox()
assert sandbox.run("print(1)").stdout.strip() == "1"  # the probe, and a check that it works
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        start = time.perf_counter()
        result = sandbox.run("print(1)")
        times.append(time.perf_counter() - start)
        assert result.stdout.strip() == "1", result
    print(json.dumps(times), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", type=Path, help="project checkouts; the first is the reference")
    parser.add_argument("--runs", type=int, default=50, help="runs per checkout (default 50)")
    args = parser.parse_args()
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(path.resolve())},
        )
        for path in args.checkouts
    ]
    times: list[list[float]] = [[] for _ in workers]
    while len(times[0]) < args.runs:
        batch = min(5, args.runs - len(times[0]))
        for worker, found in zip(workers, times):
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(f"{batch}\n")
            worker.stdin.flush()
            found += json.loads(worker.stdout.readline())
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.close()
        worker.wait()
    reference = statistics.median(times[0])
    for path, found in zip(args.checkouts, times):
        deciles = statistics.quantiles(found, n=10)
        median = statistics.median(found)
        print(
            f"{path!s:40s} median {median * 1e3:6.1f} ms  p10 {deciles[0] * 1e3:6.1f}  p90 {deciles[-1] * 1e3:6.1f}"
            f"  ratio {median / reference:.2f}"
        )


if __name__ == "__main__":
    main()
