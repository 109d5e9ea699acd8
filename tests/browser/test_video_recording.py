"""Acceptance: an omni call with chromium's fake camera (a y4m made here: the grey level steps every 0.5 s) on
the unit engine (tiny MiniCPM-o) is recorded with its frames; the review page shows, at each playhead, the frame
the model saw at that time; the MP4 decodes with both audio channels and the frames at their times."""

from __future__ import annotations

import io
import json

import av
import numpy as np
import pytest

from tests.browser.conftest import CHROMIUM
from tests.browser.pages import login, open_call_page, wait_for, wait_for_state
from tests.live_server import run_unit_live_server

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]
FPS, SECONDS, W, H = 10, 8, 160, 120


def make_y4m(path) -> None:
    """A y4m chromium loops as the camera: grey level 30 + 25 * (half-second index mod 8), 8 s."""
    with open(path, "wb") as f:
        f.write(f"YUV4MPEG2 W{W} H{H} F{FPS}:1 Ip A1:1 C420jpeg\n".encode())
        for i in range(FPS * SECONDS):
            level = 30 + 25 * ((i * 2 // FPS) % 8)
            f.write(b"FRAME\n" + bytes([level]) * (W * H) + bytes([128]) * (W * H // 2))


@pytest.fixture(scope="module")
def unit_server(tmp_path_factory, django_db_setup, django_db_blocker):
    with run_unit_live_server(tmp_path_factory, django_db_blocker) as server:
        yield server


def test_omni_call_frames_on_the_review_page_and_in_the_mp4(unit_server, playwright, fake_mic_wav, tmp_path, make_user):
    video = tmp_path / "camera.y4m"
    make_y4m(video)
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={fake_mic_wav}", f"--use-file-for-fake-video-capture={video}",
        "--autoplay-policy=no-user-gesture-required", "--disable-gpu"])  # fmt: skip
    try:
        make_user("videocaller")
        context = browser.new_context()
        context.set_default_timeout(180_000)  # the first page of a unit server waits for its engine to load
        page = context.new_page()
        login(page, unit_server.url, "videocaller")
        open_call_page(page, unit_server.url)
        page.click("#start")
        wait_for_state(page, "live", timeout_ms=90_000)
        page.click("#camera")
        wait_for(page, "p.imagesSent >= 2", timeout_ms=60_000)
        units = page.evaluate("window.parley.units.length")
        wait_for(page, f"p.units.length >= {units + 5}", timeout_ms=180_000)  # units the engine ran with frames
        session_id = page.inner_text("#session-id")
        page.click("#stop")
        wait_for_state(page, "closed")
        page.goto(f"{unit_server.url}/recordings/session/{session_id}/")
        page.wait_for_function("() => window.review && window.review.state === 'ready'", timeout=300_000)
        page.wait_for_function("() => window.reviewFrames && window.reviewFrames.count >= 4", timeout=10_000)
        times = page.evaluate("window.reviewFrames.times")
        assert times == sorted(times)
        duration = page.evaluate("window.review.duration")
        canvas = page.locator("#wave-caller")
        box = canvas.bounding_box()
        shown = {}
        for k in range(len(times)):
            target = times[k] + min(0.3, (times[k + 1] - times[k]) / 2 if k + 1 < len(times) else 0.3)
            seeks = page.evaluate("window.review.seeks")
            # a click at the target's pixel of the waveform, scrolled into view first (the review panels can push
            # the waveform below the fold, where a click at page coordinates lands nowhere)
            canvas.click(position={"x": box["width"] * target / duration, "y": box["height"] / 2})
            # the playhead lands where the click's pixel is (a long call has more than 0.05 s a pixel)
            page.wait_for_function(f"() => window.review.seeks > {seeks}")
            # the player applies a seek a moment after the click: wait for the playhead to be there (within two
            # pixels' time), not only for the click to be counted
            near = max(0.05, 2 * duration / box["width"])
            page.wait_for_function(f"() => Math.abs(window.review.position - {target}) <= {near}")
            page.wait_for_function("() => Math.abs(window.reviewFrames.position - window.review.position) < 1e-6")
            page.wait_for_function("() => window.reviewFrames.t !== null")
            state = page.evaluate("window.reviewFrames")
            # the frame shown is the last one the model had seen by the playhead
            assert state["t"] <= state["position"] + 1e-6
            assert state["index"] == len(times) - 1 or times[state["index"] + 1] > state["position"]
            shown[state["index"]] = page.evaluate("document.getElementById('frame').src")
        assert len(shown) >= len(times) - 1  # (a click lands within a few ms of the target)
        assert page.evaluate("window.reviewFrames.errors") == []

        mp4_url = page.get_attribute("#download-mp4", "href")
        data = page.request.get(unit_server.url + mp4_url).body()
        index_url = page.evaluate("document.getElementById('review').dataset.framesindexUrl")
        index = json.loads(page.request.get(unit_server.url + index_url).body())["frames"]
        with av.open(io.BytesIO(data)) as mp4:
            assert mp4.streams.audio[0].codec_context.channels == 2
            pcm = np.concatenate([f.to_ndarray() for f in mp4.decode(audio=0)], axis=1)
            assert pcm.shape[0] == 2 and np.abs(pcm[0]).max() > 0 and np.abs(pcm[1]).max() > 0  # caller, agent
            mp4.seek(0)
            frames = [(float(f.time), f.to_ndarray(format="rgb24").mean()) for f in mp4.decode(video=0)]
        assert [t for t, _ in frames][: len(index)] == pytest.approx([f["t"] for f in index], abs=0.002)
        levels = {round(m / 25) for _, m in frames}
        assert len(levels) >= 2  # the camera's changing picture, not one frame repeated
    finally:
        browser.close()
