"""Text that came from a model or its tools, made inert where people read it: log files, consoles, the viewer.

A run's output may hold anything the code printed: NUL, terminal escape sequences (``ESC ] 52`` writes the
clipboard, ``ESC ] 8`` hides a link behind text, others set the window title, clear the screen or move the
cursor; 8-bit terminals read U+009B as ``ESC [``) and bidirectional overrides (U+202A-202E, U+2066-2069), which
make text read in another order than it runs. :func:`inert` writes each of those characters as its escape
(``\\x1b``, ``\\u202e``), so a terminal, a log viewer or a browser shows it instead of obeying it; newlines and
tabs stay. Only what is shown is changed: the model gets its tool text exactly as the sandbox returned it, and
the JSON log keeps every character (:func:`json_inert` only spells those characters as JSON escapes).
"""

from __future__ import annotations

from typing import Any

__all__ = ["INERT_CHARACTERS", "inert", "inert_values", "json_inert"]

_CONTROLS = [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]
_BIDI = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
INERT_CHARACTERS = frozenset(chr(c) for c in (*_CONTROLS, *_BIDI))
"""C0 controls but tab and newline, DEL, C1 controls, and the bidirectional marks, embeddings, overrides and
isolates."""
_TEXT = str.maketrans({c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in (*_CONTROLS, *_BIDI)})
_JSON = str.maketrans({c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0), *_BIDI)})


def inert(text: str) -> str:
    """``text`` with every character of :data:`INERT_CHARACTERS` written as its Python-style escape."""
    return text.translate(_TEXT)


def inert_values(value: Any) -> Any:
    """:func:`inert` applied to every string in nested lists and dicts (keys too); other values as they are."""
    if isinstance(value, str):
        return inert(value)
    if isinstance(value, dict):
        return {inert_values(k): inert_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [inert_values(v) for v in value]
    return value


def json_inert(text: str) -> str:
    """A JSON document (``json.dumps(..., ensure_ascii=False)``) with DEL, the C1 controls and the bidirectional
    characters spelled as ``\\uXXXX``, as JSON already spells the C0 controls: it parses back to the same values,
    and ``cat`` or ``less`` of the file shows the escapes. (Those characters only occur inside JSON strings.)"""
    return text.translate(_JSON)
