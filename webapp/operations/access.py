"""Who may use the operations console: active staff users holding the action's explicit permission.

Superusers hold every permission; other staff get them through the admin (user or group
permissions on ``operations``). The page, its socket, its metrics and each action check here, with
the project's one test of a grant (``webapp.accounts.permissions.may``).
"""

from __future__ import annotations

from webapp.accounts.permissions import DISABLE_VOICE, may  # noqa: F401 - the console's callers import them from here

VIEW_CONSOLE = "operations.view_console"
END_SESSION = "accounts.end_session"  # shared with the /ops/ occupancy page
DRAIN_SERVICE = "operations.drain_service"
CONTROL_ADMISSION = "operations.control_admission"
