#!/usr/bin/env bash
# The whole test suite under every thread setting, then beside busy processes: a test of exactness must fix every
# input that decides the bits (CPU matmuls round differently with another thread count), and a test that waits must
# wait on an event, not on the machine being quiet. This runs what another user's machine would.
#
# Usage:
#     scripts/stress_suite.sh                   # six runs of `pytest`, then a table; exits 1 if any run failed
#     scripts/stress_suite.sh -m "not slow"     # extra arguments go to every pytest run
#     STRESS_RUNS="1 loaded" scripts/stress_suite.sh   # a subset of the runs below
#
# Runs (each the README's `pytest`, in this environment):
#     unset    OMP_NUM_THREADS unset (torch's default: the physical cores)
#     1, 2, 4  OMP_NUM_THREADS=1, 2, 4 (4 oversubscribes a 2-core machine)
#     loaded   OMP_NUM_THREADS unset, beside one busy-looping process per core
#     venv     the README's whole test command in a fresh venv under /tmp (scripts/fresh_venv_tests.sh), as a
#              newcomer runs it: the interpreter then lives elsewhere than the machine's
#
# Logs and JUnit reports go to ${STRESS_DIR:-${TMPDIR:-/tmp}/lit-agentrl-stress}/<run>.{log,xml}, never into the
# repository. On 2 cores the six runs take about 50 minutes (the loaded one about 12, the venv one 10).
set -uo pipefail
cd "$(dirname "$0")/.."

RUNS="${STRESS_RUNS:-unset 1 2 4 loaded venv}"
OUT="${STRESS_DIR:-${TMPDIR:-/tmp}/lit-agentrl-stress}"
mkdir -p "$OUT"
export WANDB_MODE=offline

BUSY=()
stop_busy() {
    for pid in "${BUSY[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${BUSY[@]}"; do wait "$pid" 2>/dev/null; done
    BUSY=()
}
trap stop_busy EXIT

run_suite() {  # run_suite NAME [VAR=VALUE...]: the suite with the given environment; prints its summary line
    local name="$1"
    shift
    run_logged "$name" env "$@" python -m pytest -q -p no:cacheprovider --junitxml="$OUT/$name.xml" "${PYTEST_ARGS[@]}"
}

run_logged() {  # run_logged NAME COMMAND...: COMMAND's output to NAME's log; prints its summary line
    local name="$1"
    shift
    local start=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local code=$?
    local summary
    summary="$(grep -E '^=*.* (passed|failed|error)' "$OUT/$name.log" | tail -n 1 | tr -d '=' | sed 's/^ *//')"
    printf '%-8s exit %-3s %5ss  %s\n' "$name" "$code" "$((SECONDS - start))" "${summary:-no summary: see $OUT/$name.log}"
    grep -E '^(FAILED|ERROR) ' "$OUT/$name.log" | sed 's/^/         /'
    return "$code"
}

PYTEST_ARGS=("$@")
failed=0
echo "stress_suite: runs '$RUNS'; logs in $OUT"
for run in $RUNS; do
    case "$run" in
        unset) run_suite unset -u OMP_NUM_THREADS || failed=1 ;;
        loaded)
            for _ in $(seq "$(nproc)"); do
                python -c 'while True: pass' &
                BUSY+=($!)
            done
            run_suite loaded -u OMP_NUM_THREADS || failed=1
            stop_busy
            ;;
        venv)
            run_logged venv scripts/fresh_venv_tests.sh -q -p no:cacheprovider --junitxml="$OUT/venv.xml" \
                "${PYTEST_ARGS[@]}" || failed=1
            ;;
        *[!0-9]* | "") echo "stress_suite: unknown run '$run' (use unset, a thread count, loaded or venv)" >&2; exit 2 ;;
        *) run_suite "$run" OMP_NUM_THREADS="$run" || failed=1 ;;
    esac
done
[ "$failed" = 0 ] && echo "stress_suite: every run passed" || echo "stress_suite: a run failed (see above)"
exit "$failed"
