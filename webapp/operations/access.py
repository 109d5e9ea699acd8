"""Who may use the operations console: active staff users holding the action's explicit permission.

Superusers hold every permission; other staff get them through the admin (user or group
permissions on ``operations``). The page, its socket, its metrics and each action check here.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

VIEW_CONSOLE = "operations.view_console"
END_SESSION = "accounts.end_session"  # shared with the /ops/ occupancy page
DRAIN_SERVICE = "operations.drain_service"
CONTROL_ADMISSION = "operations.control_admission"
DISABLE_VOICE = "operations.disable_voice"


def may(user: AbstractBaseUser | AnonymousUser | None, permission: str) -> bool:
    """True for an active staff user with ``permission`` (queries the database: call off the event loop)."""
    if user is None or not user.is_authenticated or not user.is_active or not user.is_staff:
        return False
    return user.has_perm(permission)
