"""The agent-author API (the seed's contract): register a LangGraph ``AgentGraph`` under an ``agent_name``, or an
OpenAI-client function with :func:`register_openai_agent`, or a Gym-style environment with
:func:`register_environment`."""

from lit_agentrl.agents.base import AgentGraph, AgentGraphOutput, BaseAgentGraph
from lit_agentrl.agents.chat_model import ChatModel, CustomChatModel, find_first_ai_index, find_last_ai_index
from lit_agentrl.agents.config import cfg_get, load_agent_cfg
from lit_agentrl.agents.drift import count_template_drift
from lit_agentrl.agents.environment import Environment, EnvironmentAgent, register_environment
from lit_agentrl.agents.openai_client import AgentResult, OpenAIClientAgent, register_openai_agent
from lit_agentrl.agents.registry import get_agent_class, import_agent_modules, register, registered_agents

# Built-in agents register themselves on import; so do the adapters of the field's libraries (which import their
# library only when a row uses it).
from lit_agentrl.agents import geo3k, guess_digit, mathcode, matheval, openai_command, single_turn, vision_toy  # noqa: F401  isort: skip
from lit_agentrl.agents import libraries  # noqa: F401  isort: skip

__all__ = [
    "AgentGraph",
    "AgentGraphOutput",
    "AgentResult",
    "BaseAgentGraph",
    "ChatModel",
    "CustomChatModel",
    "Environment",
    "EnvironmentAgent",
    "OpenAIClientAgent",
    "cfg_get",
    "count_template_drift",
    "find_first_ai_index",
    "find_last_ai_index",
    "get_agent_class",
    "import_agent_modules",
    "load_agent_cfg",
    "register",
    "register_environment",
    "register_openai_agent",
    "registered_agents",
]
