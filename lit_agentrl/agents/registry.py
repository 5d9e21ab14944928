"""The agent registry: ``agent_name`` -> AgentGraph class, filled by ``@register``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from lit_agentrl.registry import Registry, import_modules

if TYPE_CHECKING:
    from lit_agentrl.agents.base import AgentGraph

AGENTS: Registry[Any] = Registry(
    "agent",
    on_replace="warn",  # users may replace a built-in (the seed's own example re-registers "matheval_agent")
    unknown="unknown agent_name {name!r}; registered agents: {names}. Import the module that defines it (config key "
    "`agent_modules`) so its @register runs.",
)
G = TypeVar("G", bound=type)


def register(agent_name: str) -> Callable[[G], G]:
    """Class decorator: route dataset rows whose ``agent_name`` is ``agent_name`` to this graph class."""
    return AGENTS.register(agent_name)


def registered_agents() -> list[str]:
    """Names of every registered agent, sorted."""
    return AGENTS.names()


def get_agent_class(agent_name: str) -> type[AgentGraph]:
    """The class registered as ``agent_name``; ``KeyError`` listing the registered names otherwise."""
    return AGENTS.get(agent_name)


def import_agent_modules(modules: list[str]) -> None:
    """Import users' agent modules, by dotted name or by ``.py`` path, so their ``@register`` runs."""
    import_modules(modules, kind="agent")
