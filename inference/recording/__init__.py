"""Session recordings: the raw chunk format (``chunks``), the writer (``recorder``), the reader (``reader``).

The inference service writes; post-processing in the web tier reads through ``inference.api``.
"""
