#!/usr/bin/env bash
# Build (or reuse) a venv that holds what the GPU machine holds (scripts/gpu_machine.txt) and nothing of this project,
# to test the offline install from the wheelhouse (scripts/gpu_wheelhouse.py) and the CPU smoke check on it:
#
#     ${LIT_AGENTRL_GPU_MACHINE_VENV:-$HOME/.cache/lit-agentrl/gpu-machine-venv}
#
# The machine runs Python 3.12 with torch 2.11.0+cu130; the nearest CPU build here is torch 2.13.0+cpu for Python 3.11
# (the registry's torch 2.11 wheels are CUDA builds, gigabytes with their libraries), so the venv has those; every other
# version is the machine's.
#     PY="$(scripts/build_gpu_machine_env.sh)"   # stdout is only the venv's python; pip's output goes to stderr
# Rebuilt when scripts/gpu_machine.txt or this script changes; any failure exits non-zero.
set -Eeuo pipefail
exec 3>&1 1>&2
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LIT_AGENTRL_GPU_MACHINE_VENV:-$HOME/.cache/lit-agentrl/gpu-machine-venv}"
STAMP="$(cat "$REPO/scripts/gpu_machine.txt" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
if [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$STAMP" ] || ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    rm -rf "$VENV"
    python3.11 -m venv "$VENV"
    # The machine's list, its torch replaced by the CPU build (comments and blank lines dropped).
    sed -e 's/#.*//' -e 's/^torch==.*/torch==2.13.0/' -e '/^ *$/d' "$REPO/scripts/gpu_machine.txt" \
        | "$VENV/bin/python" -m pip install -q -r /dev/stdin
    echo "$STAMP" > "$VENV/.stamp"
fi
echo "$VENV/bin/python" >&3
