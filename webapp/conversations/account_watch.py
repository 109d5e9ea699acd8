"""Live calls' periodic check of their accounts: deactivated or deleted by any means ends the call.

The save signal (``webapp.accounts.revocation``) ends a call at once for the admin and ``save()``, but a queryset
``update()`` or raw SQL sends none; a check on ``session.update`` alone would miss a call that sends no updates.
So every ``PARLEY_ACCOUNT_CHECK_S`` the live calls' users are read again: once per event loop for all of its
calls, not once per call. One read per call each period had been a database connection opened and closed in a
thread, 13 a second at 200 calls and 7 % of a web process's interpreter (bench/notes/serving-e2e.md).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable

from channels.db import database_sync_to_async
from django.conf import settings

from webapp.conversations import services

logger = logging.getLogger(__name__)


class _AccountChecks:
    """One event loop's watched users and the task that reads them every period, while any is watched."""

    def __init__(self) -> None:
        self.waiting: dict[object, set[asyncio.Future[None]]] = {}
        self.task: asyncio.Task | None = None

    def watch(self, user_id: object) -> asyncio.Future[None]:
        """A future that completes once ``user_id`` is found inactive or gone."""
        found_inactive: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(user_id, set()).add(found_inactive)
        if self.task is None:
            self.task = asyncio.create_task(self._check_every_period())
        return found_inactive

    def forget(self, user_id: object, found_inactive: asyncio.Future[None]) -> None:
        futures = self.waiting.get(user_id)
        if futures is not None:
            futures.discard(found_inactive)
            if not futures:
                del self.waiting[user_id]

    async def _check_every_period(self) -> None:
        try:
            while self.waiting:
                await asyncio.sleep(settings.PARLEY_ACCOUNT_CHECK_S)
                user_ids = list(self.waiting)
                try:
                    active = await database_sync_to_async(services.active_user_ids)(user_ids=user_ids)
                except services.ServiceFault:
                    continue  # the database is unreachable just now (logged there): ask again next period
                except Exception:  # noqa: BLE001 - one failed read must not end every call's watch in this process
                    logger.exception("realtime.account_check_failed", extra={"calls": len(user_ids)})
                    continue
                for user_id in user_ids:
                    if user_id not in active:
                        for found_inactive in self.waiting.pop(user_id, ()):
                            if not found_inactive.done():
                                found_inactive.set_result(None)
        finally:
            self.task = None  # no await since the last check of ``waiting``: a new watch starts a new task


_checks_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AccountChecks] = weakref.WeakKeyDictionary()


async def watch_account(
    *, user_id: object, ended: Callable[[], bool], on_inactive: Callable[[], Awaitable[None]]
) -> None:
    """Call ``on_inactive`` within ``PARLEY_ACCOUNT_CHECK_S`` once the user is deactivated or deleted (unless the
    call has ``ended`` by then). Cancel the task to stop watching."""
    loop = asyncio.get_running_loop()
    checks = _checks_by_loop.get(loop)
    if checks is None:
        checks = _checks_by_loop[loop] = _AccountChecks()
    found_inactive = checks.watch(user_id)
    try:
        await found_inactive
    finally:
        checks.forget(user_id, found_inactive)
    if not ended():
        await on_inactive()
