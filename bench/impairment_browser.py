"""Calls from a real browser over an impaired network, WebSocket against WebRTC, in one run: mouth-to-ear as the
page hears it.

``bench/impairment.py`` models the listener (a Python caller and a playout model of its own); this bench puts
Debian chromium in its place: its Opus encoder and decoder, its NetEq jitter buffer with loss concealment, its
audio clock. The call page runs with the fake microphone playing a chirp every 500 ms (``?raw=1&tap=1``: the
page records what enters its audio graph from the microphone and what the agent's audio gives it), the echo
engine returns each chirp on the same tick, and cross-correlation gives each chirp's mouth-to-ear
(``tests/browser/latency_probe.py``: capture, network both ways, the server, the jitter buffer; no sound card).

Each call goes through ``impair_relay.py``'s relays (50 +/- 20 ms each way, then 2 % and 5 % loss each way, as
``bench/impairment.py``). WebSocket: the page is loaded through the TCP relay, so its socket is too. WebRTC: the
page's ``POST /v1/realtime/calls`` is rewritten in flight (Playwright's routing; the server is not changed): the
offer's candidates are replaced by the relay's back port and the answer's by its front port, so the only path
ICE finds is the relay.

    .venv/bin/python bench/impairment_browser.py --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.impair_relay import Impairment, TcpRelay, UdpRelay  # noqa: E402
from bench.impairment import CONDITIONS, conditions_of, host_address, through_relay  # noqa: E402
from bench.latency_browser import (  # noqa: E402
    CHROMIUM,
    PASSWORD,
    USERNAME,
    LoadSampler,
    launch_chromium,
    percentiles,
    server_env,
    start_server,
)
from bench.results_io import write_result  # noqa: E402
from tests.browser.latency_probe import run_measured_call, write_marked_wav  # noqa: E402

TRANSPORTS = ("webrtc", "websocket")
# The page's own figures at the end of a call: the browser's (getStats) for WebRTC, its jitter player's for the
# WebSocket.
PAGE_FIGURES = ("underruns", "overruns", "playedMs", "transport", "state_after_stop")


class RelayLoop:
    """An event loop on its own thread for the relays: Playwright's sync API holds the main one."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="relays", daemon=True)
        self.thread.start()

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def call(self, fn, *args):
        return self.run(_call(fn, *args))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


async def _call(fn, *args):
    return fn(*args)


def route_through(page, relays: RelayLoop, relay: UdpRelay, host: str) -> None:
    """The page's WebRTC offer and the server's answer, their candidates replaced by the relay's ports."""
    front_port, back_port = relays.run(relay.start(host))

    def rewrite(route) -> None:
        offer, client = through_relay(route.request.post_data or "", host, back_port, required=False)
        relay.client = client  # where the server's packets go until the browser has been heard from
        response = route.fetch(post_data=offer)
        if response.status != 201 and response.status != 200:
            route.fulfill(response=response)
            return
        answer, relay.upstream = through_relay(response.text(), host, front_port)
        route.fulfill(response=response, body=answer)

    page.route("**/v1/realtime/calls*", rewrite)


def one_call(args, browser, url: str, transport: str, label: str, relays: RelayLoop, host: str) -> dict:
    delay, jitter, loss = CONDITIONS[label]
    page = browser.new_page()
    page.set_default_timeout(60_000)
    tcp = udp = None
    try:
        page_url = url
        if transport == "websocket":
            tcp = TcpRelay(Impairment(delay, jitter, loss, seed=1), ("127.0.0.1", int(url.rsplit(":", 1)[1])))
            page_url = f"http://127.0.0.1:{relays.run(tcp.start())}"
        else:
            udp = UdpRelay(Impairment(delay, jitter, loss, seed=2))
            route_through(page, relays, udp, host)
        page.goto(f"{page_url}/accounts/login/")
        page.fill("input[name=username]", USERNAME)
        page.fill("input[name=password]", PASSWORD)
        page.click("form [type=submit]")
        page.wait_for_url(lambda u: "/accounts/login/" not in u)
        page.goto(f"{page_url}/?raw=1&tap=1&transport={transport}")
        page.wait_for_function("() => window.parley && window.parley.state === 'idle'")
        call = run_measured_call(page, args.seconds, must_close=False)
    finally:
        page.close()
        for relay in (tcp, udp):
            if relay is not None:
                relays.call(relay.close)
    marks = call.marks()
    final = call.final
    counts = (tcp or udp).counts
    return {
        "transport_used": final.get("transport"),
        "mouth_to_ear_ms": marks.summary(),
        "delays_ms": [round(d, 1) for d in marks.delays_ms],
        "page": {k: final.get(k) for k in PAGE_FIGURES},
        "page_buffer_ms": percentiles([s["bufferMs"] for s in call.samples if s.get("bufferMs") is not None]),
        "relay": {"packets": counts.packets, "lost": counts.lost},
    }


def run(args, url: str, wav: Path) -> dict:
    from playwright.sync_api import sync_playwright

    host = host_address()
    relays = RelayLoop()
    results: dict = {}
    try:
        with sync_playwright() as pw:
            browser = launch_chromium(pw, wav)
            try:
                for label in args.conditions:
                    for transport in args.transports:
                        row = one_call(args, browser, url, transport, label, relays, host)
                        results.setdefault(label, {})[transport] = row
                        m = row["mouth_to_ear_ms"]
                        print(
                            f"{label:18} {transport:9} ({row['transport_used']}) chirps {m.get('marks')} "
                            f"m2e p50 {m.get('p50_ms')} p95 {m.get('p95_ms')} max {m.get('max_ms')}  "
                            f"underruns {row['page']['underruns']}  relay lost {row['relay']['lost']}  "
                            f"20 s after Stop: {row['page']['state_after_stop']}",
                            flush=True,
                        )
                        time.sleep(1.5)  # the session's slot is free again
            finally:
                browser.close()
    finally:
        relays.close()
    return results


def add_floors(results: dict) -> None:
    """Each impaired row's floor: the same transport's clean call (its median, same run) plus the network's mean
    delay both ways, before any jitter is absorbed or any loss recovered. What a row has above it is what the
    jitter, the loss and the buffers that absorb them cost; a goal below the floor is out of reach of that
    transport on that network."""
    for label, rows in results.items():
        delay = CONDITIONS[label][0]
        for transport, row in rows.items():
            clean = results.get("clean", {}).get(transport, {}).get("mouth_to_ear_ms", {}).get("p50_ms")
            p95 = row["mouth_to_ear_ms"].get("p95_ms")
            if label == "clean" or clean is None or p95 is None:
                continue
            floor = clean + 2 * delay
            row["floor_ms"] = {
                "clean_p50_plus_mean_delay_both_ways": round(floor, 1),
                "p95_above": round(p95 - floor, 1),
            }
            print(f"{label:18} {transport:9} floor {floor:.1f} ms (clean p50 + 2 x {delay} ms): p95 {p95 - floor:+.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument("--out", default=None, help="a folder for the result instead of bench/results")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        parser.error(f"chromium not found at {CHROMIUM} (apt-get install chromium, or set CHROMIUM)")
    var_dir = Path(tempfile.mkdtemp(prefix="parley-impairment-"))
    proc = None
    try:
        wav = write_marked_wav(var_dir / "marks.wav")
        env = server_env(SimpleNamespace(engine="echo", warm_start="off", jitter_ms=0, trace=None), var_dir)
        env["PARLEY_RECORD"] = "off"  # as bench/impairment.py: post-processing would share the web process
        proc, url = start_server(env)
        load_before = os.getloadavg()[0]
        with LoadSampler() as sampler:
            results = run(args, url, wav)
        add_floors(results)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(var_dir, ignore_errors=True)
    result = {
        "bench": "impairment_browser",
        "seconds_per_call": args.seconds,
        "conditions": conditions_of(args.conditions),
        "host": {"cpus": os.cpu_count(), "load_avg_1m_before": round(load_before, 2), "load_avg_1m": sampler.summary()},
        "results": results,
    }
    path = write_result(result, "impairment-browser-echo", out=args.out)
    print(json.dumps({k: v for k, v in result.items() if k != "results"}))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
