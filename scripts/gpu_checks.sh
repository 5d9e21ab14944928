#!/usr/bin/env bash
# The GPU proof, on a machine with a CUDA GPU, in parts that each finish within 10 minutes:
#   part 1: what the machine has, then one table (scripts/gpu_checks.py): an FSDP2 bf16 training step of a
#           Qwen3-0.6B-shaped model (tokens/s, MFU, peak memory), the transformers engine's generation tokens/s, a
#           short colocated-SGLang `lit-agentrl fit` and its memory/* metrics (skipped, saying why, without SGLang),
#           and the memory planner's predictions beside them;
#   part 2: every GPU-only test (tests marked `gpu`: SGLang release/resume, FSDP2 over NCCL, bf16 engine);
#   part 3: the multi-turn slow-tools benchmark on the GPU.
# Before any part, a machine without the project's pure-Python dependencies (LangGraph, jsonargparse, math-verify,
# ...) gets them offline from wheelhouse/ (built on a machine with a registry: python scripts/gpu_wheelhouse.py),
# without touching its torch.
#   bash scripts/gpu_checks.sh [--part N] [pytest args]    # no --part: all three; GPU_CHECKS_OUT=path.json keeps
#                                                          # the table's JSON there
# Exits non-zero if the install, a table row, a test or the benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's lit_agentrl, installed or not

part=all
if [ "${1:-}" = "--part" ]; then part="$2"; shift 2; fi

ensure_dependencies() {
    python -c "import langgraph, jsonargparse, math_verify, lit_agentrl.cli" 2>/dev/null && return 0
    local wheelhouse="${GPU_WHEELHOUSE:-wheelhouse}"
    [ -f "$wheelhouse/requirements.txt" ] || {
        echo "gpu_checks: the project's dependencies are missing and there is no wheelhouse/ to install them from" \
             "(python scripts/gpu_wheelhouse.py builds it where a registry is reachable)" >&2
        return 1
    }
    local torch_before
    torch_before="$(python -c 'import torch; print(torch.__version__)')"
    python -m pip install --no-index --find-links "$wheelhouse" -r "$wheelhouse/requirements.txt" || return 1
    [ "$(python -c 'import torch; print(torch.__version__)')" = "$torch_before" ] || {
        echo "gpu_checks: the install changed torch ($torch_before)" >&2
        return 1
    }
    python -c "import langgraph, jsonargparse, math_verify, lit_agentrl.cli"
}

run_table() {
    python scripts/gpu_checks.py --info || return 1
    python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'" || return 1
    python scripts/gpu_checks.py --out "${GPU_CHECKS_OUT:-$(mktemp -d)/gpu_checks.json}"
}

run_tests() {
    python -m pytest -m gpu -s -p no:cacheprovider tests/gpu "$@"
}

run_benchmark() {
    local status=0
    for latency in pareto bimodal; do
        python benchmarks/multiturn_slow_tools.py --device cuda --latency "$latency" --repeats 2 || status=1
    done
    return $status
}

ensure_dependencies || exit 1
case "$part" in
    1) run_table ;;
    2) run_tests "$@" ;;
    3) run_benchmark ;;
    all)
        run_table; table=$?
        run_tests "$@"; tests=$?
        run_benchmark; bench=$?
        echo "table: exit $table; gpu tests: exit $tests; multi-turn benchmark: exit $bench"
        [ "$table" -eq 0 ] && [ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
        ;;
    *) echo "gpu_checks: --part must be 1, 2 or 3, got $part" >&2; exit 2 ;;
esac
