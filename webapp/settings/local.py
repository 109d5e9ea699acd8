"""``make run`` on a developer machine: the base settings with DEBUG on."""

from webapp.settings.base import *  # noqa: F403

DEBUG = True  # make run is a developer machine; production.py is the other path
