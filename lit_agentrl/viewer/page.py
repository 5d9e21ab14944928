"""The viewer page: ``page.html`` (inline CSS and JS, no external requests) with the payload embedded as JSON."""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

PLACEHOLDER = "__LIT_AGENTRL_PAYLOAD__"
# Inside a <script> element only "</script" (or "<!--") ends it early: escaping "<" in the JSON's strings (where
# alone it can occur) makes any model text inert. ">" and "&" for good measure; U+2028/9 break older JS parsers.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def render_page(payload: dict[str, Any]) -> str:
    """The self-contained HTML page of a :func:`~lit_agentrl.viewer.payload.build_payload` payload."""
    template = resources.files("lit_agentrl.viewer").joinpath("page.html").read_text(encoding="utf-8")
    head, found, tail = template.partition(PLACEHOLDER)
    if not found:
        raise RuntimeError(f"lit_agentrl/viewer/page.html has no {PLACEHOLDER} placeholder")
    return head + script_safe_json(payload) + tail


def script_safe_json(value: Any) -> str:
    """JSON that can sit inside a ``<script>`` element; NaN and infinities become null (JSON has neither)."""
    text = json.dumps(_finite(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.translate(_SCRIPT_SAFE)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
