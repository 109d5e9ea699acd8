"""WebRTC calls (``POST /v1/realtime/calls``): aiortc peer connections in the web process's event loop."""
