"""A hub endpoint on loopback: a real HTTP server answering the requests huggingface_hub makes to fetch a
snapshot (repository info, the file tree, HEAD and GET of each file), serving folders given per repository.
``HF_ENDPOINT`` (``HubAccess.endpoint``) points the resolver at it, so a download runs with no network."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "c" * 40
MIB = 1 << 20
HOLD_LIMIT_S = 120
HOLD_AFTER = 12 * MIB


class LocalHub:
    def __init__(self, repos: dict[str, Path], chunk_delay_s: float = 0.0, hold: threading.Event | None = None):
        self.repos = repos
        self.chunk_delay_s = chunk_delay_s  # a pause per MiB sent: a download slow enough to watch
        # a file body larger than HOLD_AFTER stops there until this is set (at most HOLD_LIMIT_S), so a test
        # sees the download under way whatever the machine's speed (past huggingface_hub's 10 MiB read chunk)
        self.hold = hold
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: the test reads hub.requests
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, head=True)

            def do_GET(self) -> None:
                hub.answer(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> LocalHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo: str) -> dict[str, Path]:
        root = self.repos[repo]
        return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}

    def answer(self, handler: BaseHTTPRequestHandler, *, head: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        self.requests.append(f"{handler.command} {path}")
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path):
            repo = m[1]
            if repo not in self.repos:
                return self.send(handler, 404, b'{"error": "Repository not found"}', head)
            siblings = [{"rfilename": name} for name in self.files(repo)]
            return self.send(handler, 200, json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode(), head)
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/.*)?", path):
            tree = [{"type": "file", "path": name, "size": p.stat().st_size, "oid": _git_oid(p.read_bytes())}
                    for name, p in self.files(m[1]).items()]  # fmt: skip
            return self.send(handler, 200, json.dumps(tree).encode(), head)
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            file = self.files(m[1]).get(m[3]) if m[1] in self.repos else None
            if file is None:
                return self.send(handler, 404, b"Entry not found", head, {"X-Error-Code": "EntryNotFound"})
            data = file.read_bytes()
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{_git_oid(data)}"'}
            return self.send(handler, 200, data, head, headers)
        return self.send(handler, 404, b"not found", head)

    def send(self, handler, status: int, body: bytes, head: bool, headers: dict[str, str] | None = None) -> None:
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if head:
            return
        for start in range(0, len(body), MIB):
            handler.wfile.write(body[start : start + MIB])
            handler.wfile.flush()
            if self.chunk_delay_s:
                time.sleep(self.chunk_delay_s)
            if self.hold is not None and start + MIB == HOLD_AFTER and len(body) > HOLD_AFTER + MIB:
                self.hold.wait(HOLD_LIMIT_S)


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
