"""Errors the user fixes in a config or a data file.

The CLI prints a :class:`UserInputError` as one message (what is wrong, where: file, line, field or key; and what
would be valid), without a traceback; ``LIT_AGENTRL_TRACEBACK=1`` shows the full traceback. Raise it for bad input
found at setup, never for a bug in the package.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """A configuration or data error, with an optional ``hint`` on how to fix it.

    A ``ValueError`` so that callers that caught ``ValueError`` before keep working.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message if hint is None else f"{message}\nhint: {hint}")
        self.message = message
        self.hint = hint
