"""``skyrl_gym``: SkyRL-gym's text environments (``skyrl_gym.make``), trained as they are.

Rows are SkyRL's own: ``env_class`` names the environment (its shipped ``gsm8k``, ``gsm8k_multi_turn``, ``aime``,
``lcb``, ``text2sql``, ``search``, ``searchcode``, or one a user registered with ``skyrl_gym.register`` in a module
the run imports), and the whole row is the environment's ``extras`` (``reward_spec``, ``extra_info``, ``max_turns``:
whatever the environment reads). The environment's ``init(prompt)`` gives the conversation to start from; each model
turn is one ``step``, whose ``observations`` (chat messages) are appended and whose ``reward`` is that turn's; the
environment says when it is done (it counts its own turns). Its ``get_metrics()`` are logged per agent.

Agent YAML (optional): ``env_config``, keyed by ``env_class`` like SkyRL's ``environment.skyrl_gym`` section (e.g.
``{text2sql: {db_path: /data/sql}, search: {search_url: ..., topk: 3, timeout: 30, log_requests: false}}``); and
``max_turns`` (default 8), a cap on model turns for an environment that never says done.

``init`` and ``step`` run in a worker thread: SkyRL's environments block (code runs in subprocesses, search calls
HTTP), and the event loop serves every other trajectory meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar

from langchain_core.messages import convert_to_openai_messages
from omegaconf import DictConfig, OmegaConf

from lit_agentrl.agents.config import cfg_get
from lit_agentrl.agents.environment import Environment, register_environment
from lit_agentrl.agents.libraries.imports import library_problem, require

__all__ = ["SkyRLGymEnvironment"]

AGENT = "skyrl_gym"
EXTRA = "skyrl-gym"
_USER = f"agent {AGENT!r}"


def _skyrl_gym() -> Any:
    return require("skyrl_gym", extra=EXTRA, user=_USER)


@register_environment(AGENT)
class SkyRLGymEnvironment(Environment):
    """One episode of the SkyRL-gym environment a row's ``env_class`` names."""

    required_fields: ClassVar[tuple[str, ...]] = ("env_class",)

    async def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        env_class = row["env_class"]
        extras = {key: value for key, value in row.items() if key != "messages"}
        self.env = _skyrl_gym().make(env_class, env_config=self._env_config(env_class), extras=extras)
        conversation, _metadata = await asyncio.to_thread(self.env.init, convert_to_openai_messages(row["messages"]))
        return list(conversation)

    async def step(self, action: str) -> tuple[list[dict[str, Any]], float, bool]:
        output = await asyncio.to_thread(self.env.step, action)
        self.metrics = {key: float(value) for key, value in self.env.get_metrics().items()}
        return list(output.get("observations") or []), float(output.get("reward") or 0.0), bool(output["done"])

    def close(self) -> None:
        if hasattr(self, "env"):
            self.env.close()

    def _env_config(self, env_class: str) -> DictConfig:
        configs = cfg_get(self.cfg, "env_config", None)
        chosen = configs.get(env_class) if configs is not None else None
        settings = OmegaConf.to_container(chosen) if isinstance(chosen, DictConfig) else {}
        return OmegaConf.create(settings if isinstance(settings, dict) else {})

    @classmethod
    def row_errors(cls, row: Mapping[str, Any]) -> list[str]:
        problem = library_problem("skyrl_gym", extra=EXTRA, user=_USER)
        if problem:
            return [problem]
        env_class = row.get("env_class")
        registered = sorted(_skyrl_gym().registry)
        if env_class is not None and env_class not in registered:
            return [
                f"field 'env_class': {env_class!r} is not a registered SkyRL-gym environment; registered: {registered}"
            ]
        return []
