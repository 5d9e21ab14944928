#!/usr/bin/env bash
# The GPU proof in one run on one GPU (issue 11, item 9), for a machine with a CUDA GPU:
#   1. what the machine has (torch, CUDA, the GPU, SGLang, transformers);
#   2. one table (scripts/gpu_checks.py): an FSDP2 bf16 training step of a Qwen3-0.6B-shaped model (tokens/s, MFU,
#      peak memory), the transformers engine's generation tokens/s, a short colocated-SGLang `lit-agentrl fit` and
#      its memory/* metrics, and the memory planner's predictions beside them; SGLang rows are skipped without it;
#   3. every GPU-only test (tests marked `gpu`): SGLang release/resume, FSDP2 over NCCL, bf16 engine;
#   4. the multi-turn slow-tools benchmark on the GPU (issue 15's async target; on CPU the engine's compute is the floor).
#   bash scripts/gpu_checks.sh [pytest args]    # GPU_CHECKS_OUT=path.json keeps the table's JSON there
# Exits non-zero if a table row or a test failed; the tests run even when a row failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline PYTHONUNBUFFERED=1
python scripts/gpu_checks.py --info || exit 1
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'" || exit 1
out="${GPU_CHECKS_OUT:-$(mktemp -d)/gpu_checks.json}"
python scripts/gpu_checks.py --out "$out"
table=$?
python -m pytest -m gpu -s -p no:cacheprovider tests/gpu "$@"
tests=$?
bench=0
for latency in pareto bimodal; do
    python benchmarks/multiturn_slow_tools.py --device cuda --latency "$latency" --repeats 2 || bench=1
done
echo "table: exit $table (JSON: $out); gpu tests: exit $tests; multi-turn benchmark: exit $bench"
[ "$table" -eq 0 ] && [ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
