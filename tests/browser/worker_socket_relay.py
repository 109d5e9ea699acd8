"""Let Playwright's ``page.route_web_socket`` play the server for the call page, whose socket lives in a Worker.

Playwright routes WebSockets opened by the page, not by its Workers (microsoft/playwright#37048). For the
scripted-server tests, the socket Worker's script is served with a relay in front: its ``WebSocket`` is
replaced by one that asks the page's main thread (over a BroadcastChannel) to open the real socket, which
``route_web_socket`` then takes, and relays every frame both ways. The Worker's own code, the page's handling
of events and both audio paths stay real; only where the socket object lives moves. Every other browser test
talks to a real daphne through the Worker's own socket.
"""

from __future__ import annotations

import re

from playwright.sync_api import Page, Route

CHANNEL = "parley-test-socket-relay"

# Main thread: open the real sockets the Worker asks for and relay their frames.
PAGE_SIDE = """
(() => {
  const channel = new BroadcastChannel("CHANNEL");
  const sockets = new Map();
  channel.onmessage = ({ data: m }) => {
    if (m.op === "open") {
      const ws = new WebSocket(m.url);
      ws.binaryType = "arraybuffer";
      sockets.set(m.id, ws);
      ws.onopen = () => channel.postMessage({ id: m.id, op: "opened" });
      ws.onmessage = ({ data }) => channel.postMessage({ id: m.id, op: "message", data });
      ws.onclose = (event) => {
        sockets.delete(m.id);
        channel.postMessage({ id: m.id, op: "closed", code: event.code });
      };
    } else if (m.op === "send") {
      sockets.get(m.id)?.send(m.data);
    } else if (m.op === "close") {
      sockets.get(m.id)?.close(m.code);
    }
  };
})();
""".replace("CHANNEL", CHANNEL)

# Worker: a WebSocket whose frames go through the page's main thread.
WORKER_SIDE = """
{
  const channel = new BroadcastChannel("CHANNEL");
  const relayed = new Map();
  channel.onmessage = ({ data: m }) => relayed.get(m.id)?.receive(m);
  class RelayedWebSocket {
    static CONNECTING = 0;
    static OPEN = 1;
    static CLOSING = 2;
    static CLOSED = 3;
    constructor(url) {
      this.id = crypto.randomUUID();
      this.url = url;
      this.readyState = 0;
      this.binaryType = "blob";
      relayed.set(this.id, this);
      channel.postMessage({ id: this.id, op: "open", url });
    }
    send(data) {
      channel.postMessage({ id: this.id, op: "send", data });
    }
    close(code = 1000) {
      if (this.readyState >= 2) return;
      this.readyState = 2;
      channel.postMessage({ id: this.id, op: "close", code });
    }
    receive(m) {
      if (m.op === "opened") {
        this.readyState = 1;
        this.onopen?.({});
      } else if (m.op === "message") {
        this.onmessage?.({ data: m.data });
      } else if (m.op === "closed") {
        this.readyState = 3;
        relayed.delete(this.id);
        this.onclose?.({ code: m.code });
      }
    }
  }
  self.WebSocket = RelayedWebSocket;
}
""".replace("CHANNEL", CHANNEL)


def relay_worker_sockets(page: Page) -> None:
    """From the next navigation on, the call page's socket Worker opens its sockets through the main thread."""
    page.add_init_script(PAGE_SIDE)

    def serve_with_relay(route: Route) -> None:
        original = route.fetch()
        route.fulfill(response=original, body=WORKER_SIDE + original.text())

    page.route(re.compile(r".*/transport-worker\.js(\?.*)?$"), serve_with_relay)
