"""The service's checkpoint setting made concrete: a hub id becomes its snapshot folder, and ``engine="auto"``
(``PARLEY_ENGINE`` unset with ``PARLEY_CHECKPOINT`` set) becomes the checkpoint's family."""

from __future__ import annotations

from inference.checkpoints.hub import HubError, is_hub_id, resolve_checkpoint
from inference.checkpoints.identify import family_of
from inference.config import HubAccess, InferenceConfig

AUTO = "auto"


def resolve_config(config: InferenceConfig, access: HubAccess | None = None) -> InferenceConfig:
    """``config`` with a local checkpoint folder and a concrete engine name.

    Raises:
        HubError: the hub id cannot be resolved, or the family cannot be told (the message names why).
    """
    checkpoint = config.checkpoint
    if checkpoint is not None and is_hub_id(checkpoint):
        config = config.with_overrides(checkpoint=resolve_checkpoint(str(checkpoint), access))
    if config.engine != AUTO:
        return config
    if config.checkpoint is None:
        return config.with_overrides(engine="echo")
    try:
        family = family_of(config.checkpoint)
    except ValueError as exc:
        raise HubError(f"PARLEY_ENGINE is unset and {config.checkpoint} names no family: {exc}") from None
    return config.with_overrides(engine=family)
