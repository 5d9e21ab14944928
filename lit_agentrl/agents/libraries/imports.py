"""The field's libraries, imported only by the adapter that uses them; a missing one named with the extra to install."""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType
from typing import Any

__all__ = ["MissingLibrary", "import_object", "library_problem", "require"]


class MissingLibrary(ImportError):
    """An adapter's library is not installed."""


def _message(module: str, extra: str, user: str, cause: BaseException) -> str:
    return f"{user} needs the library {module!r} ({cause}); install it with: pip install 'lit-agentrl[{extra}]'"


def require(module: str, *, extra: str, user: str) -> ModuleType:
    """``module`` imported; :class:`MissingLibrary` naming ``user`` (an agent, a reward) and the extra otherwise."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingLibrary(_message(module, extra, user, exc)) from exc


@cache
def library_problem(module: str, *, extra: str, user: str) -> str | None:
    """Why ``module`` cannot be used (for a row check at setup), or None; imported once per process."""
    try:
        require(module, extra=extra, user=user)
    except MissingLibrary as exc:
        return str(exc)
    return None


@cache
def import_object(path: str, *, key: str, user: str) -> Any:
    """The object an agent YAML names as ``"module:name"`` under ``key``; ``ValueError`` naming both otherwise."""
    module, _, name = str(path).partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{user}: cfg.{key} {path!r} is not an importable 'module:name' ({exc})") from exc
