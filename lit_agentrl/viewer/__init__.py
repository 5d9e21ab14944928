"""Trajectory logs and their viewer.

:mod:`~lit_agentrl.viewer.records` defines the log's format (one JSON object per trajectory, one line each), which
:class:`~lit_agentrl.callbacks.TrajectoryLog` writes through :mod:`~lit_agentrl.viewer.writer`;
:mod:`~lit_agentrl.viewer.payload` reads a run's logs back and :mod:`~lit_agentrl.viewer.page` renders them into one
self-contained HTML page (``lit-agentrl view RUN_DIR``, :func:`~lit_agentrl.viewer.cli.view_main`).
"""

from lit_agentrl.viewer.page import render_page
from lit_agentrl.viewer.payload import build_payload

__all__ = ["build_payload", "render_page"]
