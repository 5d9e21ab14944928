"""The agent registry: ``agent_name`` -> AgentGraph class, filled by ``@register``."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from lit_agentrl.agents.base import AgentGraph

log = logging.getLogger(__name__)
_graph_registry: dict[str, type[AgentGraph]] = {}
G = TypeVar("G", bound=type)


def register(agent_name: str) -> Callable[[G], G]:
    """Class decorator: route dataset rows whose ``agent_name`` is ``agent_name`` to this graph class."""
    if not isinstance(agent_name, str) or not agent_name:
        raise ValueError(f"register() needs a non-empty agent name, got {agent_name!r}")

    def decorator(cls: G) -> G:
        existing = _graph_registry.get(agent_name)
        if existing is not None and existing is not cls:
            # Users may replace a built-in (the seed's own example re-registers "matheval_agent"): last one wins.
            log.warning("agent name %r: %s replaces %s", agent_name, _qualified(cls), _qualified(existing))
        _graph_registry[agent_name] = cls
        return cls

    return decorator


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def registered_agents() -> list[str]:
    """Names of every registered agent, sorted."""
    return sorted(_graph_registry)


def get_agent_class(agent_name: str) -> type[AgentGraph]:
    """The class registered as ``agent_name``; ``KeyError`` listing the registered names otherwise."""
    try:
        return _graph_registry[agent_name]
    except KeyError:
        raise KeyError(
            f"unknown agent_name {agent_name!r}; registered agents: {registered_agents()}. "
            "Import the module that defines it (config key `agent_modules`) so its @register runs."
        ) from None


def import_agent_modules(modules: list[str]) -> None:
    """Import users' agent modules, by dotted name or by ``.py`` path, so their ``@register`` runs."""
    import_modules(modules, kind="agent")


def import_modules(modules: list[str], kind: str) -> None:
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
