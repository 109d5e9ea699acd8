"""A live call's periodic check of its account: deactivated or deleted by any means ends the call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from channels.db import database_sync_to_async
from django.conf import settings

from webapp.conversations import services


async def watch_account(
    *, user_id: object, ended: Callable[[], bool], on_inactive: Callable[[], Awaitable[None]]
) -> None:
    """Call ``on_inactive`` within ``PARLEY_ACCOUNT_CHECK_S`` once the user is deactivated or deleted.

    The save signal (``webapp.accounts.revocation``) ends a call at once for the admin and ``save()``, but a
    queryset ``update()`` or raw SQL sends none; a check on ``session.update`` alone would miss a call that
    sends no updates. One indexed read per live call per period, off the audio path.
    """
    while not ended():
        await asyncio.sleep(settings.PARLEY_ACCOUNT_CHECK_S)
        try:
            await database_sync_to_async(services.account_check)(user_id=user_id)
        except services.AccountInactive:
            await on_inactive()
            return
        except services.ServiceFault:
            continue  # the database is unreachable just now (logged there): ask again next period
