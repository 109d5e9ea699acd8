"""``EmbeddedService``: the in-process service and its configuration live in an object, not in module state."""

from __future__ import annotations

from inference import embedded
from inference.embedded import EmbeddedService


async def test_an_embedded_service_keeps_its_own_service_and_configuration():
    ours = EmbeddedService()
    process_slots = embedded.current_config().slots
    await ours.start(None, {"engine": "echo", "slots": process_slots + 1})
    try:
        assert ours.current_config().slots == process_slots + 1
        assert embedded.current_config().slots == process_slots, "the process's own was not touched"
        service = await ours.local_service()
        assert service.config.slots == process_slots + 1
        assert ours.built_service() is service and await ours.local_service() is service
        assert await ours.on_service_loop(lambda s: s) is service
    finally:
        await ours.stop()
    assert ours.current_config().slots == process_slots, "after stop the configuration is read from the env again"


async def test_a_forked_child_forgets_the_service_it_inherited():
    ours = EmbeddedService()
    await ours.start(None, {"engine": "echo", "slots": 1})
    inherited = await ours.local_service()
    ours.forget_inherited_service()
    try:
        fresh = ours.built_service()
        assert fresh is not inherited and not fresh.started
    finally:
        await inherited.stop()
