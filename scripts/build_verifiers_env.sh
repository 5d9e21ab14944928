#!/usr/bin/env bash
# Build (or reuse) a venv holding Prime Intellect's `verifiers` (v1 API, with its TextArena
# extra) and print the path of its python (stdout holds only that path; everything else goes
# to stderr). lit_agentrl/agents/libraries/verifiers_episode.py runs under that python:
#
#     VF_PY="$(scripts/build_verifiers_env.sh)"
#     echo '{"taskset": {...}, "task_index": 0}' | "$VF_PY" lit_agentrl/agents/libraries/verifiers_episode.py
#
# verifiers 0.4.0 pins openai<3 while our main environment has openai 3, so it lives apart:
# ${LIT_AGENTRL_VERIFIERS_VENV:-$HOME/.cache/lit-agentrl/verifiers-venv}.
#
# It also does the first-use work verifiers would otherwise do (over the network) in a rollout:
#  * the `null` harness (the plain chat loop) runs as a PEP 723 uv script. Its uv environment is
#    created here ($HOME/.cache/verifiers/runtimes/scripts/<sha256>.py, environment under uv's
#    cache, $UV_CACHE_DIR or $HOME/.cache/uv) and locked (`<sha256>.py.lock` beside it): verifiers
#    runs `uv sync --script` with UV_OFFLINE=false on every rollout, which re-resolves against
#    PyPI unless a lock exists; with the lock it needs no network.
#  * TextArena's word games need NLTK's `words` corpus, which nltk downloads from GitHub. Where
#    that fails, a stand-in corpus (built from the hunspell en_US dictionary textarena ships) is
#    written to $VENV/nltk_data, which nltk searches; the games then draw words from it.
set -Eeuo pipefail
VERIFIERS_VERSION="0.4.0"
UV_VERSION="0.13.8"
VENV="${LIT_AGENTRL_VERIFIERS_VENV:-$HOME/.cache/lit-agentrl/verifiers-venv}"
exec 3>&1 1>&2
PY="$VENV/bin/python"

installed() {  # the pinned versions are there and import
    [ -x "$PY" ] && [ -x "$VENV/bin/uv" ] && "$PY" - "$VERIFIERS_VERSION" "$UV_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
assert m.version("verifiers") == sys.argv[1] and m.version("uv") == sys.argv[2]
import textarena, nltk, verifiers.v1  # noqa: F401
EOF
}

if ! installed; then
    python3.11 -m venv --clear "$VENV"
    "$VENV/bin/pip" install -q "verifiers[ta]==$VERIFIERS_VERSION" "uv==$UV_VERSION"
    installed
fi

# NLTK `words` corpus: the real one where it downloads, else the stand-in.
"$PY" - "$VENV/nltk_data" <<'EOF'
import os, re, sys
from pathlib import Path
import nltk
from nltk.corpus import words

def ok() -> bool:
    try:
        return bool(words.words("en")) and bool(words.words("en-basic"))
    except LookupError:
        return False

if not ok() and not (nltk.download("words", quiet=True, download_dir=sys.argv[1]) and ok()):
    import textarena
    dic = Path(textarena.__file__).parent / "envs" / "utils" / "data" / "en_US.dic"
    entries = [line.split("/")[0].strip() for line in dic.read_text(errors="replace").splitlines()[1:]]
    en = sorted({w for w in entries if re.fullmatch(r"[A-Za-z]+", w)})
    basic = [w for w in en if w.islower() and 4 <= len(w) <= 6]
    out = Path(sys.argv[1]) / "corpora" / "words"
    out.mkdir(parents=True, exist_ok=True)
    (out / "en").write_text("\n".join(en) + "\n")
    (out / "en-basic").write_text("\n".join(basic) + "\n")
    (out / "README").write_text("Stand-in for NLTK's words corpus, built offline from textarena's en_US.dic.\n")
    print(f"nltk words: wrote stand-in corpus to {out} ({len(en)} / {len(basic)} words)", file=sys.stderr)
EOF

# Warm the null harness's uv script exactly as a rollout prepares it, then lock it.
SCRIPT="$(PATH="$VENV/bin:$PATH" "$PY" - <<'EOF'
import asyncio
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime

async def main() -> None:
    runtime = SubprocessRuntime(SubprocessConfig())
    await runtime.start()
    try:
        argv = await runtime.prepare_uv_script(CHAT_PROGRAM_SOURCE, {})
    finally:
        await runtime.teardown()
    print(argv[-1])  # the script's path

asyncio.run(main())
EOF
)"
[ -f "$SCRIPT.lock" ] || "$VENV/bin/uv" lock --script "$SCRIPT" -q --no-config
"$VENV/bin/uv" sync --script "$SCRIPT" -q --no-config --offline
echo "$PY" >&3
