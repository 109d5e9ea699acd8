"""Settings modules: ``base`` (shared), ``local`` (make run), ``test`` (pytest), ``production``."""
