#!/usr/bin/env bash
# Build (or reuse) the virtual environment in which lit-agentrl runs against a real SGLang engine on CPU.
#
# SGLang 0.5.23 pins torch==2.14.1 and transformers==5.19.0 and will not import beside the torch of the
# main test environment, so it gets a venv of its own, kept OUTSIDE the clone:
#
#     ${LIT_AGENTRL_SGLANG_VENV:-$HOME/.cache/lit-agentrl/sglang-venv}
#
# Usage:
#     PY="$(scripts/build_sglang_env.sh)"    # build or reuse; stdout is ONLY the venv's python path
#                                            # (all progress and pip output go to stderr)
#     LIT_AGENTRL_SGLANG_VENV=/some/dir scripts/build_sglang_env.sh
#     LIT_AGENTRL_SGLANG_PYTHON=python3.12 scripts/build_sglang_env.sh   # interpreter for the venv
#     scripts/build_sglang_env.sh --force    # ignore the stamps and run every step again
#
# Steps (each timed):
#   1. venv         python3.11 -m venv (recreated only if its python is missing or broken)
#   2. torch        torch==2.14.1 torchvision==0.29.1
#   3. sglang       sglang==0.5.23 --no-deps
#   4. sglang-deps  sglang's declared Requires-Dist (no extras) minus the CUDA-only / unneeded ones below
#   5. repo         pip install -e "<repo>[test]" with every already-installed version as a constraint,
#                   so nothing installed above (torch, transformers, ...) is replaced
#   6. check        pip check (ignoring the dependencies deliberately left out) and an import smoke test
#                   with the sgl_kernel test shim (tests/sglang_shim) on PYTHONPATH
#
# Steps 1-4 are stamped by a hash of this script ($VENV/.lit-agentrl-stamp-base); steps 5-6 additionally by
# the clone's path and pyproject.toml ($VENV/.lit-agentrl-stamp), so a fresh clone in another folder (CI)
# only re-runs the cheap editable install. Any failure exits non-zero naming the step: nothing is skipped
# silently.
set -Eeuo pipefail

TORCH_VERSION="2.14.1"
TORCHVISION_VERSION="0.29.1"
SGLANG_VERSION="0.5.23"
# Requirements of sglang that are CUDA-only, or not needed to serve a text model on CPU. Compared after
# PEP 503 normalisation (lower case, runs of -_. as one -). torch/torchvision are installed (pinned) in step 2.
EXCLUDED_DEPS="apache-tvm-ffi av build cuda-python decord2 deepseek-recipe flash-attn-4 flashinfer-python
humming-kernels kernels modelscope numba nvidia-cutlass-dsl nvidia-mathdx nvidia-ml-py nvshmem4py-cu13 outlines
py-spy quack-kernels sgl-deep-ep sgl-deep-gemm sgl-flash-mla sglang-kernel tilelang tml-renderers torchaudio
torchcodec torch torchvision"

FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build_sglang_env.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

# Everything but the final python path goes to stderr, so PY="$(scripts/build_sglang_env.sh)" works.
exec 3>&1 1>&2

SCRIPT_PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
REPO="$(cd "$(dirname "$SCRIPT_PATH")/.." && pwd)"
VENV="${LIT_AGENTRL_SGLANG_VENV:-$HOME/.cache/lit-agentrl/sglang-venv}"
PY="$VENV/bin/python"

STEP="setup"
on_error() {
    local rc=$?
    [[ $BASHPID == "$$" ]] || exit "$rc"  # in a subshell: let the main shell report it once
    echo "" >&2
    echo "build_sglang_env.sh: FAILED in step '$STEP' (exit $rc); venv: $VENV" >&2
    echo "build_sglang_env.sh: the SGLang environment is NOT usable; fix the error above and re-run." >&2
    exit "$rc"
}
trap on_error ERR

log() { echo "[build_sglang_env $(date +%H:%M:%S)] $*"; }
T_ALL=$SECONDS
T_STEP=$SECONDS
begin() { STEP="$1"; T_STEP=$SECONDS; log "step $STEP: start"; }
end() { log "step $STEP: done in $((SECONDS - T_STEP)) s"; }

hash_of() { sha256sum | cut -d' ' -f1; }
BASE_STAMP="$VENV/.lit-agentrl-stamp-base"
STAMP="$VENV/.lit-agentrl-stamp"
BASE_HASH="$(hash_of < "$SCRIPT_PATH")"
REPO_HASH="$( { echo "$BASE_HASH"; echo "$REPO"; cat "$REPO/pyproject.toml"; } | hash_of)"

# One build at a time per venv: a second caller waits for the first, then finds its stamps.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
if ! flock -w 3600 9; then
    STEP="lock"; echo "build_sglang_env.sh: could not lock $VENV.lock within an hour" >&2; exit 1
fi

stamp_ok() { [[ $FORCE -eq 0 && -f "$1" && "$(cat "$1")" == "$2" ]] && "$PY" -c "" 2>/dev/null; }

if stamp_ok "$STAMP" "$REPO_HASH"; then
    log "up to date (stamp $STAMP matches); nothing to do"
    echo "$PY" >&3
    exit 0
fi

PIP=("$PY" -m pip --disable-pip-version-check)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
printf 'torch==%s\ntorchvision==%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" > "$WORK/torch-constraints.txt"

if stamp_ok "$BASE_STAMP" "$BASE_HASH"; then
    log "base environment up to date (stamp $BASE_STAMP matches): skipping steps venv, torch, sglang, sglang-deps"
else
    rm -f "$BASE_STAMP" "$STAMP"

    begin venv
    if ! "$PY" -c "" 2>/dev/null; then
        BASE_PY="${LIT_AGENTRL_SGLANG_PYTHON:-}"
        if [[ -z "$BASE_PY" ]]; then
            if command -v python3.11 >/dev/null 2>&1; then BASE_PY=python3.11; else BASE_PY=python3; fi
        fi
        if ! command -v "$BASE_PY" >/dev/null 2>&1; then
            echo "build_sglang_env.sh: interpreter '$BASE_PY' not found (set LIT_AGENTRL_SGLANG_PYTHON)" >&2
            false
        fi
        log "creating $VENV with $BASE_PY ($("$BASE_PY" --version 2>&1))"
        rm -rf "$VENV"
        "$BASE_PY" -m venv "$VENV"
    else
        log "reusing $VENV ($("$PY" --version 2>&1))"
    fi
    "${PIP[@]}" install --quiet --upgrade pip
    end

    begin torch
    "${PIP[@]}" install -c "$WORK/torch-constraints.txt" \
        "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
    end

    begin sglang
    "${PIP[@]}" install --no-deps "sglang==$SGLANG_VERSION"
    end

    begin sglang-deps
    EXCLUDED_DEPS="$EXCLUDED_DEPS" "$PY" - "$WORK/sglang-deps.txt" <<'EOF'
import importlib.metadata as md
import os
import re
import sys

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

excluded = {norm(n) for n in os.environ["EXCLUDED_DEPS"].split()}
kept, dropped = [], []
for req in md.requires("sglang") or []:
    marker = req.split(";", 1)[1] if ";" in req else ""
    if re.search(r"\bextra\s*==", marker):
        continue  # optional extras are not installed
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req).group(1)
    (dropped if norm(name) in excluded else kept).append(req)
if not kept:
    sys.exit("no requirements read from sglang's metadata")
with open(sys.argv[1], "w") as f:
    f.write("\n".join(kept) + "\n")
print(f"installing {len(kept)} of sglang's requirements; left out {len(dropped)}:")
for req in dropped:
    print(f"    - {req}")
EOF
    "${PIP[@]}" install -c "$WORK/torch-constraints.txt" -r "$WORK/sglang-deps.txt"
    end

    echo "$BASE_HASH" > "$BASE_STAMP"
fi

begin repo
# Pin every installed distribution (except the repo itself) to its current version: the repo's own
# requirements and test extra may add packages, but must not replace torch, transformers, tokenizers, ...
"${PIP[@]}" list --format=freeze --exclude-editable 2>/dev/null \
    | grep -v -i -E '^(lit-agentrl|lit_agentrl|pip|setuptools|wheel)==' > "$WORK/installed-constraints.txt"
"${PIP[@]}" install -c "$WORK/installed-constraints.txt" -e "$REPO[test]"
end

begin check
# pip check reports the requirements left out on purpose; any other problem fails the build.
"${PIP[@]}" check > "$WORK/pip-check.txt" 2>&1 || true
EXCLUDED_DEPS="$EXCLUDED_DEPS" "$PY" - "$WORK/pip-check.txt" <<'EOF'
import os
import re
import sys

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

excluded = {norm(n) for n in os.environ["EXCLUDED_DEPS"].split()}
problems = []
for line in open(sys.argv[1]):
    line = line.strip()
    if not line or line == "No broken requirements found.":
        continue
    m = re.match(r"sglang [^ ]+ requires ([A-Za-z0-9._-]+), which is not installed\.", line, re.I)
    if m and norm(m.group(1)) in excluded:
        continue
    m = re.match(r"sglang [^ ]+ has requirement ([A-Za-z0-9._-]+)", line, re.I)
    if m and norm(m.group(1)) in excluded:
        continue
    problems.append(line)
if problems:
    print("pip check found broken requirements:", *problems, sep="\n    ")
    sys.exit(1)
print("pip check: ok (apart from the requirements left out on purpose)")
EOF
PYTHONPATH="$REPO/tests/sglang_shim${PYTHONPATH:+:$PYTHONPATH}" SGLANG_USE_CPU_ENGINE=1 "$PY" - <<'EOF'
import importlib.metadata as md

import sglang
import torch
import transformers

import lit_agentrl

from sglang.srt.entrypoints.engine import Engine  # noqa: F401  (pulls in the scheduler and model code)

print(
    f"import check: sglang {md.version('sglang')}, torch {torch.__version__}, "
    f"transformers {transformers.__version__}, lit_agentrl from {lit_agentrl.__file__}"
)
EOF
end

echo "$REPO_HASH" > "$STAMP"
log "done in $((SECONDS - T_ALL)) s; size $(du -sh "$VENV" 2>/dev/null | cut -f1)"
echo "$PY" >&3
