"""Names a config uses, and what they stand for: one registry class behind agents (``@register``), engines
(``@register_engine``) and rewards (``@register_reward``), and the import of users' modules that fills them."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, Literal, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class Registry(Generic[T]):
    """``name -> T``, filled by :meth:`register` used as a decorator.

    Args:
        kind: what the names stand for, as errors say it (``agent``, ``rollout engine``, ``reward``).
        on_replace: a second, different object under a taken name: ``warn`` (the last one wins, as users replace
            built-ins) or ``refuse``.
        builtins: names whose module registers them when first imported, so naming one imports nothing else.
        error: the exception an unknown name raises.
        unknown: its message, a format string of ``name`` and ``names`` (the registered ones), which says how to
            register another.
    """

    def __init__(
        self,
        kind: str,
        on_replace: Literal["warn", "refuse"] = "warn",
        builtins: dict[str, str] | None = None,
        error: type[Exception] = KeyError,
        unknown: str = "unknown {kind} {name!r}; registered: {names}",
    ) -> None:
        self.kind, self.on_replace, self.error, self.unknown = kind, on_replace, error, unknown
        self.builtins = dict(builtins or {})
        self._entries: dict[str, T] = {}

    def register(self, name: str, check: Callable[[T], None] | None = None) -> Callable[[T], T]:
        """Decorator: make the decorated object the one called ``name``; ``check`` refuses an unfit one."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"registering a {self.kind} needs a non-empty name, got {name!r}")

        def decorator(obj: T) -> T:
            if check is not None:
                check(obj)
            existing = self._entries.get(name)
            if existing is not None and _qualified(existing) != _qualified(obj):
                if self.on_replace == "refuse":
                    raise ValueError(f"{self.kind} {name!r} is already registered to {existing!r}")
                log.warning("%s name %r: %s replaces %s", self.kind, name, _qualified(obj), _qualified(existing))
            self._entries[name] = obj
            return obj

        return decorator

    def names(self) -> list[str]:
        """Every name a config may use (the built-ins, and those registered so far), sorted."""
        return sorted(set(self._entries) | set(self.builtins))

    def get(self, name: str) -> T:
        """What ``name`` stands for (importing a built-in's module on first use)."""
        if name not in self._entries and name in self.builtins:
            importlib.import_module(self.builtins[name])
        try:
            return self._entries[name]
        except KeyError:
            raise self.error(self.unknown.format(kind=self.kind, name=name, names=self.names())) from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def _qualified(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def import_modules(modules: Iterable[str], kind: str) -> None:
    """Import users' modules, by dotted name or by ``.py`` path, so their registering decorators run.

    ``kind`` (``agent``, ``engine``) names what the modules hold in the errors, which name the module.
    """
    for module in modules:
        if module.endswith(".py"):
            path = Path(module)
            if not path.is_file():
                raise FileNotFoundError(f"{kind} module file {module!r} does not exist")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = loaded
            spec.loader.exec_module(loaded)
        else:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                raise ModuleNotFoundError(f"cannot import {kind} module {module!r}: {exc}") from exc
