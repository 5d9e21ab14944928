#!/usr/bin/env bash
# Build (or reuse) a small venv holding SGLang's router, the Shepherd Model Gateway (`smg`), and print the path of
# its `smg` command (stdout holds only that path; pip's output goes to stderr).
#
#     SMG="$(scripts/build_router_env.sh)"
#
# smg is a Rust binary behind a Python launcher and needs neither torch nor sglang, so it lives apart from SGLang's
# venv (whose build this leaves alone): ${LIT_AGENTRL_ROUTER_VENV:-$HOME/.cache/lit-agentrl/router-venv}.
set -Eeuo pipefail
SMG_VERSION="1.13.0"
VENV="${LIT_AGENTRL_ROUTER_VENV:-$HOME/.cache/lit-agentrl/router-venv}"
exec 3>&1 1>&2
if [ ! -x "$VENV/bin/smg" ] || [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("smg"))' 2>/dev/null)" != "$SMG_VERSION" ]; then
    python3.11 -m venv --clear "$VENV"
    "$VENV/bin/pip" install -q "smg==$SMG_VERSION"
fi
"$VENV/bin/smg" --help >/dev/null
echo "$VENV/bin/smg" >&3
