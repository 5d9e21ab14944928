"""``python -m lit_agentrl.viewer RUN_DIR``: the same as ``lit-agentrl view RUN_DIR``."""

import sys

from lit_agentrl.viewer.cli import view_main

raise SystemExit(view_main(sys.argv[1:]))
