"""``/ops/live``: the console's socket. Every console in a web process hears one broadcaster.

The broadcaster reads ``console_snapshot`` every ``BROADCAST_PERIOD_S`` while at least one console
of this process listens, and sends it to this process's Channels group. The group is per process
because every process reads the whole cluster (the registry) itself: a shared group would deliver
each snapshot once per web process. Services heartbeat every 0.5 s, so a console is at most about
one second behind.

A console hears about its credentials being revoked like a realtime socket does (its user's group,
and its API key's when it came with one; ``webapp.accounts.revocation``): a deactivated or deleted
user, or a revoked key, closes it at once with 4401.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer

from webapp.accounts import revocation
from webapp.operations.access import VIEW_CONSOLE, may
from webapp.operations.snapshot import console_snapshot

logger = logging.getLogger(__name__)

BROADCAST_PERIOD_S = 0.5
CREDENTIALS_REVOKED = 4401  # the realtime endpoint's close code for the same event (docs/protocol.md)
GROUP = f"ops-console-{socket.gethostname()[:40]}-{os.getpid()}".replace("_", "-")


class ConsoleConsumer(AsyncWebsocketConsumer):
    groups_joined: tuple[str, ...] = ()
    counted = False  # counted among the broadcaster's listeners

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not await database_sync_to_async(may)(user, VIEW_CONSOLE):
            await self.close()  # before accept: the handshake is refused with HTTP 403
            return
        # The revocation groups first: a revocation that lands while the first snapshot is built still counts.
        revocation_groups = [revocation.user_group(user.pk)]
        if (api_key_id := self.scope.get("api_key_id")) is not None:
            revocation_groups.append(revocation.api_key_group(api_key_id))
        self.groups_joined = (*revocation_groups, GROUP)
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send(text_data=json.dumps(await console_snapshot()))
        _broadcaster.listening(+1)
        self.counted = True

    async def disconnect(self, code: int) -> None:
        if self.channel_layer is not None:
            for group in self.groups_joined:
                await self.channel_layer.group_discard(group, self.channel_name)
        if self.counted:  # a refused handshake never counted as a listener
            self.counted = False
            _broadcaster.listening(-1)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Actions are POSTs (CSRF-checked and audited), never socket messages; anything sent here is ignored."""

    async def console_snapshot(self, event: dict) -> None:
        await self.send(text_data=event["text"])

    async def credentials_revoked(self, message: dict) -> None:
        """This console's user was deactivated or deleted, or its API key revoked: close it now."""
        logger.info("console.credentials_revoked", extra={"why": message["why"]})
        await self.close(code=CREDENTIALS_REVOKED)


class _Broadcaster:
    """One loop per web process, running while consoles listen."""

    def __init__(self) -> None:
        self.listeners = 0
        self.task: asyncio.Task | None = None

    def listening(self, delta: int) -> None:
        self.listeners = max(0, self.listeners + delta)
        loop = asyncio.get_running_loop()
        # A task of another (finished) loop never ends by itself: tests run each on a fresh loop.
        if self.listeners and (self.task is None or self.task.done() or self.task.get_loop() is not loop):
            self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        layer = get_channel_layer()
        while self.listeners:
            await asyncio.sleep(BROADCAST_PERIOD_S)
            try:
                text = json.dumps(await console_snapshot())
                await layer.group_send(GROUP, {"type": "console.snapshot", "text": text})
            except Exception:  # noqa: BLE001 - a failed round is logged; the next one tries again
                logger.exception("console.broadcast_failed")


_broadcaster = _Broadcaster()
