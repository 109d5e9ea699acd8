"""The socket between the web tier and ``python -m inference serve``: framing and event codec (``wire``),
the shared-token handshake (``auth``), the web tier's client and the service's connection server."""
