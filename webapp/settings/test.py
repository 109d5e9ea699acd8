"""pytest settings: embedded defaults, fast hashing, and a FILE test database.

The daphne live-server fixture runs the app in a child process, which cannot see an in-memory
SQLite database; a file makes rows written by tests visible there.
"""

import os

from webapp.env import BASE_DIR, ENV
from webapp.settings.base import *  # noqa: F403
from webapp.settings.base import DATABASES

DEBUG = False
SECRET_KEY = ENV.secret_key or "parley-insecure-test-key-for-pytest-only"
# Every test client is 127.0.0.1 and a few users connect many times: the suite would trip the limits
# (tests/webapp/security sets them low, and checks the defaults).
PARLEY_CONNECTS_PER_USER_PER_MINUTE = 100_000
PARLEY_CONNECTS_PER_KEY_PER_MINUTE = 100_000
PARLEY_KEY_FAILURE_RATE = "100000/minute"
# A test machine's loop runs late whenever the suite is busy: calls must not be refused for that
# (tests/webapp/realtime/test_loop_load.py turns the limit on).
PARLEY_WEB_LOOP_LAG_MS = 0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The suite's consent clips are tones or espeak-ng, which no recogniser hears the phrase in;
# tests/webapp/personas/test_consent_phrase.py turns the check on with recorded human speech.
PARLEY_VERIFY_CONSENT_PHRASE = False
# Likewise the recordings' caller tracks are tones; tests/webapp/recordings/test_caller_transcript.py turns it on.
PARLEY_TRANSCRIBER = "off"
CELERY_TASK_ALWAYS_EAGER = True  # even when a developer shell sets CELERY_BROKER_URL
PARLEY_WARM_START = "off"  # a test that wants one sets it (tests/browser/test_warm_start.py)

# One test database per pytest process: concurrent runs on one machine must not flush each other's
# tables. The name is explicit so that the live server (a forked child, channels'
# set_database_connection) finds the same database.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "var" / f"test_db_{os.getpid()}.sqlite3")}
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}
    # Persistent connections held by executor threads would block dropping the test database.
    DATABASES["default"]["CONN_MAX_AGE"] = 0

ALLOWED_HOSTS = [*ENV.allowed_hosts, "testserver"]
