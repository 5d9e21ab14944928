#!/usr/bin/env bash
# The README's test command as a newcomer runs it: a fresh virtual environment in a new folder under /tmp (the common
# place), activated, OMP_NUM_THREADS unset, then exactly `pip install torch==2.13.0 -e ".[test]" && pytest`.
#
# Usage:
#     scripts/fresh_venv_tests.sh                 # exits with pytest's status (or pip's, if the install failed)
#     scripts/fresh_venv_tests.sh -m "not slow"   # extra arguments go to pytest
#
# The venv is removed afterwards (LIT_AGENTRL_KEEP_VENV=1 keeps it, and prints where). CI runs this beside the
# README's command in the machine's own Python, and scripts/stress_suite.sh runs it once (its run `venv`).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="$(mktemp -d "${TMPDIR:-/tmp}/lit-agentrl-venv.XXXXXX")"
# mktemp makes the folder 0700; `python3 -m venv /tmp/x`, as a newcomer types it, makes it 0755 (umask 022). The
# code sandbox runs code as a uid of its own, which must be able to read the interpreter's folders.
chmod 755 "$VENV"
cleanup() {
    if [ -n "${LIT_AGENTRL_KEEP_VENV:-}" ]; then echo "fresh_venv_tests: kept $VENV" >&2; else rm -rf "$VENV"; fi
}
trap cleanup EXIT
echo "fresh_venv_tests: a new venv at $VENV" >&2
python3 -m venv "$VENV"
# shellcheck disable=SC1091  # the venv's own activation, made a line above
source "$VENV/bin/activate"
unset OMP_NUM_THREADS
pip install torch==2.13.0 -e ".[test]" && pytest "$@"
