"""The one test of an explicit grant: an active staff user holding the permission (superusers hold all).

Staff status alone grants nothing over other users' data: every act on it (seeing another user's
private persona, voice or recording, using their voice in a call, editing, deleting, disabling) names
its permission, and the pages, the console and the realtime endpoint all ask here.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

# Named here, not in the console's access module, because the voice pages ask for it too and sit below the console.
DISABLE_VOICE = "operations.disable_voice"


def may(user: AbstractBaseUser | AnonymousUser | None, permission: str) -> bool:
    """True for an active staff user with ``permission`` (queries the database: call off the event loop)."""
    if user is None or not user.is_authenticated or not user.is_active or not user.is_staff:
        return False
    return user.has_perm(permission)
