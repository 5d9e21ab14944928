"""The answer in the last ``\\boxed{...}`` of a text: one reader for model completions and dataset solutions.

The ``math`` reward reads completions with it, and ``data/prepare_math_lighteval.py`` reads the dataset's
ground truths with it, so an answer key and an answer are always cut out of their boxes the same way.

math-verify's own box reader (``latex2sympy2_extended``'s ``extract_boxed_content``) is not used: it joins
nearby boxes (``\\boxed{1} then \\boxed{2}`` gives ``1,2``, where the last box, ``2``, is the answer), returns
the whole text when there is no box, and keeps the tail of an unclosed box (``\\boxed{\\frac{1}{2}`` gives
``{\\frac{1}{2}``) where a truncated answer must count as no answer.
"""

from __future__ import annotations

BOX_COMMANDS: tuple[str, ...] = ("\\boxed", "\\fbox")
"""The commands that box an answer."""

_SPACE_FORM_TRAILING = ".,;"
_TOKEN_ENDS = "${}"


def _match_braces(text: str, open_idx: int) -> int | None:
    """Index just past the ``}`` closing the ``{`` at ``open_idx``; None if unbalanced."""
    depth = 0
    for idx in range(open_idx, len(text)):
        if text[idx] == "{":
            depth += 1
        elif text[idx] == "}":
            depth -= 1
            if depth == 0:
                return idx + 1
    return None


def _space_form_end(text: str, start: int) -> int:
    """End of the token in ``\\boxed 5`` (stops at whitespace, ``$`` or a brace)."""
    end = start
    while end < len(text) and not text[end].isspace() and text[end] not in _TOKEN_ENDS:
        end += 1
    while end > start and text[end - 1] in _SPACE_FORM_TRAILING:
        end -= 1  # sentence punctuation, as in "... is \boxed 5."
    return end


def _last_command(text: str) -> tuple[int, int] | None:
    """``(start, end)`` of the last box command in ``text``.

    A longer command name that starts like one (``\\boxedx``, ``\\fboxsep``) is another command: the search
    goes on to the left of it.
    """
    stop = len(text)
    while True:
        found = [(text.rfind(cmd, 0, stop), cmd) for cmd in BOX_COMMANDS]
        start, cmd = max(found)
        if start < 0:
            return None
        end = start + len(cmd)
        if end < len(text) and text[end].isalpha():
            stop = start
            continue
        return start, end


def _last_box(text: str) -> tuple[str, str] | None:
    """``(whole box, inner content)`` of the last box in ``text``."""
    command = _last_command(text)
    if command is None:
        return None
    start, after = command
    body = after
    while body < len(text) and text[body].isspace():
        body += 1
    if body < len(text) and text[body] == "{":
        end = _match_braces(text, body)
        if end is None:
            return None
        return text[start:end], text[body + 1 : end - 1]
    end = _space_form_end(text, body)
    if end == body:
        return None
    return text[start:end], text[body:end]


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}``/``\\fbox{...}``/``\\boxed x`` in ``text``, command included.

    Braces are counted so nested groups like ``\\frac{1}{2}`` stay intact; returns None when there is no box
    or its braces never close (truncated output).
    """
    box = _last_box(text)
    return None if box is None else box[0]


def extract_boxed_answer(text: str) -> str | None:
    """Content of the last box in ``text``, stripped (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``).

    For nested boxes (``\\boxed{\\boxed{3}}``) the innermost, last-opened box wins. The brace-less form takes
    one token (``\\boxed 12.`` -> ``12``). None when there is no box, its braces never close, or it is empty.
    """
    box = _last_box(text)
    if box is None:
        return None
    return box[1].strip() or None
