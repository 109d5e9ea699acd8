"""``make run`` on a developer machine: the base settings with DEBUG on.

DEBUG is only safe on loopback: ``scripts/run.sh`` refuses another bind address with these settings,
and the secret key is generated once and kept in ``var/secret-key`` (0600), never a key from the source.
"""

from webapp.env import ENV
from webapp.settings.base import *  # noqa: F403
from webapp.settings.base import VAR_DIR
from webapp.settings.secret_files import read_or_create_secret

DEBUG = True  # make run is a developer machine; production.py is the other path
SECRET_KEY = ENV.secret_key or read_or_create_secret(VAR_DIR / "secret-key")
