"""``lit-agentrl view RUN_DIR``: write a run's trajectory log as one HTML page, and optionally serve it locally."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import sys
from pathlib import Path

from lit_agentrl.viewer.page import render_page
from lit_agentrl.viewer.payload import build_payload


def view_main(argv: list[str]) -> int:
    """Write ``RUN_DIR/view.html`` (or ``--out``); 0 on success, 2 when there is no log."""
    parser = argparse.ArgumentParser(
        prog="lit-agentrl view", description="Write a run's trajectory log (TrajectoryLog) as a self-contained page."
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a folder with trajectories/*.jsonl somewhere below it")
    parser.add_argument("--out", help="the page to write (default: RUN_DIR/view.html)")
    parser.add_argument("--max-trajectories", type=int, default=5000, help="keep the latest N (default: 5000)")
    parser.add_argument("--serve", action="store_true", help="serve the page on localhost until interrupted")
    parser.add_argument("--port", type=int, default=8765, help="port for --serve (0: any free port)")
    ns = parser.parse_args(argv)
    try:
        payload = build_payload(ns.run_dir, ns.max_trajectories)
    except FileNotFoundError as exc:
        print(f"lit-agentrl view: {exc}", file=sys.stderr)
        return 2
    out = Path(ns.out) if ns.out else Path(ns.run_dir) / "view.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    page = render_page(payload)
    out.write_text(page, encoding="utf-8")
    print(f"{out}: {len(payload['trajectories'])} trajectories from {payload['run']}")
    if ns.serve:
        serve(page.encode("utf-8"), ns.port)
    return 0


def serve(page: bytes, port: int) -> None:
    """Serve ``page`` at http://127.0.0.1:PORT/ (loopback only: the log may hold private prompts)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/", "/index.html", "/view.html"):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

    with http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        print(f"serving on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C to stop)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
