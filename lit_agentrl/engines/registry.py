"""The engine registry: ``RolloutCallback.engine`` name -> :class:`RolloutEngine` subclass, by ``@register_engine``.

The built-in engines register themselves when their module is imported; that happens on first use, so naming
``transformers`` does not import SGLang's client code, and importing :mod:`lit_agentrl.engines` imports neither.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.engines.placement import EnginePlacement
from lit_agentrl.errors import UserInputError
from lit_agentrl.registry import Registry

ENGINES: Registry[type[RolloutEngine]] = Registry(
    "rollout engine",
    on_replace="warn",
    builtins={
        "transformers": "lit_agentrl.engines.hf",
        "transformers_process": "lit_agentrl.engines.process",
        "sglang": "lit_agentrl.engines.sglang",
        "sglang_http": "lit_agentrl.engines.sglang_http",
        "sglang_router": "lit_agentrl.engines.sglang_router",
    },
    error=UserInputError,
    unknown="unknown rollout engine {name!r}; registered engines: {names}. To add one, subclass "
    "lit_agentrl.engines.RolloutEngine, decorate it with @register_engine({name!r}) and list its module in "
    "RolloutCallback.engine.modules.",
)
E = TypeVar("E", bound=type[RolloutEngine])


def register_engine(name: str) -> Callable[[E], E]:
    """Class decorator: make this :class:`RolloutEngine` subclass the engine called ``name`` in configs.

    Example::

        @register_engine("my_server")
        class MyServerEngine(RolloutEngine):
            async def async_generate(self, input_ids=None, sampling_params=None, return_logprob=False, **kw): ...
            def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True): ...
    """

    def check(cls: type[RolloutEngine]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, RolloutEngine)):
            raise TypeError(
                f"@register_engine({name!r}) needs a subclass of lit_agentrl.engines.RolloutEngine, got {cls!r}"
            )
        if inspect.isabstract(cls):
            missing = sorted(getattr(cls, "__abstractmethods__", ()))
            raise TypeError(
                f"@register_engine({name!r}): {cls.__module__}.{cls.__qualname__} does not implement {missing}"
            )

    return ENGINES.register(name, check)  # type: ignore[return-value]


def registered_engines() -> list[str]:
    """Names of every engine a config may choose (the built-ins, and those registered so far), sorted."""
    return ENGINES.names()


def get_engine_class(name: str) -> type[RolloutEngine]:
    """The class registered as ``name`` (importing a built-in's module on first use).

    Raises ``ValueError`` listing the registered names and how to register another.
    """
    return ENGINES.get(name)


def build_engines(
    name: str, model_path: str, seed: int = 0, placement: EnginePlacement | None = None, **kwargs: Any
) -> list[RolloutEngine]:
    """The engines called ``name`` over the model at ``model_path``, built by the class's :meth:`~RolloutEngine.build`.

    ``kwargs`` (the config's ``engine.kwargs``) go to the constructor: ``transformers`` and ``sglang`` give one
    in-process engine; ``sglang_http`` gives one client per entry of ``urls`` (balanced by the rollout manager);
    ``sglang_router`` one client of the router at ``router_url``, which balances.
    ``placement`` is this rank's place on its node (``RolloutCallback`` passes it): engines on the rank's GPUs
    use it (``sglang``: ``base_gpu_id``; ``transformers`` on ``cuda``: ``cuda:<local rank>``), others ignore it.
    """
    return get_engine_class(name).build(model_path, seed=seed, placement=placement, **kwargs)
