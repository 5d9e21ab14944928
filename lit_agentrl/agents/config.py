"""Agent YAML files: a row's ``agent_cfg_path`` becomes the graph's ``cfg`` (``cfg.xxx`` and ``cfg["xxx"]``).

:func:`cfg_get` reads one key with a default, whatever the ``cfg`` (None, a ``DictConfig``, a dict).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def load_agent_cfg(path: str | Path | None) -> DictConfig | None:
    """Read an agent YAML into a ``DictConfig``; None when the row names no file.

    Raises ``FileNotFoundError`` or ``ValueError`` naming the file when it is missing, unparsable, or not
    a mapping at its top level.
    """
    if path is None or path == "":
        return None
    return _load(str(Path(path).resolve()))


@lru_cache(maxsize=256)
def _load(resolved: str) -> DictConfig:
    path = Path(resolved)
    if not path.is_file():
        raise FileNotFoundError(f"agent config {resolved!r} does not exist (from a row's agent_cfg_path)")
    try:
        cfg = OmegaConf.load(path)
    except Exception as exc:  # yaml and omegaconf raise several types; all mean "not valid YAML here"
        raise ValueError(f"agent config {resolved!r} is not valid YAML: {exc}") from exc
    if not isinstance(cfg, DictConfig):
        raise ValueError(f"agent config {resolved!r} must be a YAML mapping of keys to values, got a list")
    OmegaConf.set_readonly(cfg, True)  # one cfg object is shared by every trajectory of the agent
    return cfg


def cfg_get(cfg: Any, key: str, default: Any) -> Any:
    """``cfg.key`` when the agent YAML sets it (not null), else ``default``.

    ``cfg`` may be None (the row names no YAML), a ``DictConfig``, a dict, or any object with attributes.
    """
    if cfg is None:
        return default
    value = cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
    return default if value is None else value
