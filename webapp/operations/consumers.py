"""``/ops/live``: the console's socket. Every console in a web process hears one broadcaster.

The broadcaster reads ``console_snapshot`` every ``BROADCAST_PERIOD_S`` while at least one console
of this process listens, and sends it to this process's Channels group. The group is per process
because every process reads the whole cluster (the registry) itself: a shared group would deliver
each snapshot once per web process. Services heartbeat every 0.5 s, so a console is at most about
one second behind.
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

from webapp.operations.access import VIEW_CONSOLE, may
from webapp.operations.snapshot import console_snapshot

logger = logging.getLogger(__name__)

BROADCAST_PERIOD_S = 0.5
GROUP = f"ops-console-{socket.gethostname()[:40]}-{os.getpid()}".replace("_", "-")


class ConsoleConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        if not await database_sync_to_async(may)(self.scope.get("user"), VIEW_CONSOLE):
            await self.close()  # before accept: the handshake is refused with HTTP 403
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        await self.send(text_data=json.dumps(await console_snapshot()))
        _broadcaster.listening(+1)

    async def disconnect(self, code: int) -> None:
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(GROUP, self.channel_name)
        _broadcaster.listening(-1)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Actions are POSTs (CSRF-checked and audited), never socket messages; anything sent here is ignored."""

    async def console_snapshot(self, event: dict) -> None:
        await self.send(text_data=event["text"])


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
