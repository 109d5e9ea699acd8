"""Engine registry: ``build_engine(config)`` maps an engine name to its class, importing lazily.

Model engines pull in torch and their model code only when chosen, so the echo engine (and the
web tier's imports of ``inference.contracts``) stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from inference.engines.base import Engine
from inference.errors import EngineNotAvailable

if TYPE_CHECKING:  # a type only: the engines' own modules load without the service's settings (pydantic),
    # so a GPU bench needs no more than torch, transformers and safetensors
    from inference.config import InferenceConfig

# engine name -> (module, class). Each class has from_config(config) -> Engine.
ENGINES: dict[str, tuple[str, str]] = {
    "echo": ("inference.engines.echo", "EchoEngine"),
    "moshi": ("inference.engines.lockstep", "LockstepEngine"),
    "personaplex": ("inference.engines.lockstep", "LockstepEngine"),
    "lockstep": ("inference.engines.lockstep", "LockstepEngine"),
    "minicpmo": ("inference.engines.unit", "UnitEngine"),
    "unit": ("inference.engines.unit", "UnitEngine"),
}


def build_engine(config: InferenceConfig) -> Engine:
    """Construct (not warm up) the engine named by ``config.engine``.

    A hub id in ``config.checkpoint`` is resolved to its snapshot first, and ``engine="auto"`` to the
    checkpoint's family (``inference/checkpoints/resolve.py``).

    Raises:
        EngineNotAvailable: the name is unknown, or its module does not exist (yet) in this checkout, or the
            checkpoint's hub id cannot be resolved.
    """
    from inference.checkpoints.hub import HubError
    from inference.checkpoints.resolve import resolve_config

    try:
        config = resolve_config(config)
    except HubError as exc:
        raise EngineNotAvailable(f"PARLEY_CHECKPOINT={config.checkpoint}: {exc}") from None
    try:
        module_name, class_name = ENGINES[config.engine]
    except KeyError:
        raise EngineNotAvailable(
            f"unknown engine {config.engine!r}; known engines: {', '.join(sorted(ENGINES))}"
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise  # a real missing dependency inside the module: show it as is
        raise EngineNotAvailable(
            f"engine {config.engine!r} needs module {module_name}, which is not in this checkout yet"
        ) from exc
    engine_class = getattr(module, class_name, None)
    if engine_class is None:
        raise EngineNotAvailable(f"module {module_name} has no class {class_name} for engine {config.engine!r}")
    return engine_class.from_config(config)
