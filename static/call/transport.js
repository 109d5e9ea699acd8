// The page's handle on its socket, which lives in a Worker (transport-worker.js) so that audio never
// waits for the main thread. One Transport per connection; messages of a closed one are ignored.

export class Transport {
  /**
   * @param {{onOpen: () => void, onEvent: (text: string) => void,
   *          onAudio: (audio: {samples: number, sumSquares: number, viaEvent: boolean}) => void,
   *          onMic: (piece: {rms: number, time: number, samples: number, sent: boolean, sentAt: number}) => void,
   *          onError: (error: {code: string, message: string, eventType?: string}) => void,
   *          onClose: (code: number) => void}} handlers
   */
  constructor(handlers) {
    this.handlers = handlers;
    this.open = false;
    this.worker = new Worker(new URL("./transport-worker.js", import.meta.url), { type: "module" });
    this.worker.onmessage = ({ data }) => this.onMessage(data);
    // A worker that cannot load (a blocked script, a syntax error) is a closed connection, not a hung page.
    this.worker.onerror = (event) => {
      event.preventDefault?.();
      const worker = this.worker;
      this.handlers.onError({ code: "client_transport_failed", message: event.message || "the socket worker failed" });
      this.onMessage({ type: "closed", code: 1006 });
      worker?.terminate();
    };
  }

  onMessage(data) {
    if (!this.worker) return; // closed by the page: what was in flight is stale
    const h = this.handlers;
    switch (data.type) {
      case "open":
        this.open = true;
        h.onOpen();
        break;
      case "event":
        h.onEvent(data.text);
        break;
      case "audio":
        h.onAudio(data);
        break;
      case "mic":
        h.onMic(data);
        break;
      case "error":
        h.onError(data);
        break;
      case "closed":
        this.open = false;
        this.worker = null;
        h.onClose(data.code);
        break;
    }
  }

  connect(url) {
    this.worker.postMessage({ type: "connect", url });
  }

  /** Send one client event; false when the socket is not open. */
  send(event) {
    if (!this.open) return false;
    this.worker.postMessage({ type: "send", text: JSON.stringify(event) });
    return true;
  }

  /** The mic worklet's pieces go straight to the socket (`port`'s other end is the worklet's). */
  takeMicrophone(port) {
    this.worker?.postMessage({ type: "mic", port }, [port]);
  }

  /** The agent's audio goes straight to the player worklet (`port`'s other end is the worklet's). */
  feedPlayer(port) {
    this.worker?.postMessage({ type: "player", port }, [port]);
  }

  /** Which audio flows: the microphone's only while the call is live, the agent's while live or prefilling. */
  gate({ uplink, downlink }) {
    this.worker?.postMessage({ type: "gate", uplink, downlink });
  }

  /** Close the socket (the worker ends itself once it has closed); nothing more is reported. */
  close(code = 1000) {
    this.worker?.postMessage({ type: "close", code });
    this.worker = null;
    this.open = false;
  }
}
