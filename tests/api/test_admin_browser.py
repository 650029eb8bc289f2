"""/admin in a real browser: Debian's headless Chromium driven by Playwright (no browser download), against the
embedded stack (real engine, worker, queue) served with auth on over loopback HTTP.

A wrong key cannot log in, a non-admin key gets 403; an admin logs in, sees both charts drawn and the live
block refresh, opens the completed demo job and its speaker-coloured transcript, and cancels a queued job
through the confirmation page. Screenshots go to ``test-artifacts/admin/``.

Needs ``apt-get install chromium`` and ``pip install playwright`` (never ``playwright install``); skips with a
loud reason without them, fails instead under ``DIARIST_REQUIRE_SERVICES=1`` (CI).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from diarist.apikeys import create_key
from diarist.models import Job
from tests.api.conftest import services_with

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "admin"
CHROMIUM = os.environ.get("DIARIST_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.slow


def _need(what: str) -> None:
    msg = f"BROWSER TEST NOT RUN: {what} (apt-get install chromium; pip install playwright; see .ci/run)"
    if os.environ.get("DIARIST_REQUIRE_SERVICES") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def site(stack):
    """The auth-on app over the stack's handles on a free loopback port, a completed demo job, a queued job."""
    import uvicorn

    from api.app import create_app
    from cli.commands.demo import demo_recording

    svc = services_with(stack, auth=True)
    app = create_app(svc)
    app.state.engine_stats = stack.app.state.engine_stats
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)

    admin, user = create_key(svc.db, "browser-admin", admin=True), create_key(svc.db, "browser-client")
    auth = {"Authorization": f"Bearer {admin.token}"}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as c, open(demo_recording(), "rb") as f:
        done_id = c.post("/v1/jobs", files={"file": ("phonecall.wav", f, "audio/wav")}).json()["id"]
        deadline = time.monotonic() + 240
        while (job := c.get(f"/v1/jobs/{done_id}").json())["status"] not in ("completed", "failed"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
    assert job["status"] == "completed", job
    queued = Job(status="queued", queue="transcribe.long", duration_s=1800.0, filename="board-meeting.mp3",
                 owner_key=user.id, created_at=datetime.now(UTC) - timedelta(minutes=3),
                 lease_expires_at=datetime.now(UTC) + timedelta(hours=1))  # its pickup deadline: not yet
    with svc.db.session() as s:  # a backlog job no worker has taken yet (its message waits in the queue)
        s.add(queued)
    yield {"url": url, "svc": svc, "admin": admin.token, "user": user.token, "done": done_id, "queued": queued.id}
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    if not Path(CHROMIUM).is_file() and not shutil.which("chromium"):
        _need(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("the playwright Python package is not installed")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=ARGS,
            headless=True, viewport={"width": 1360, "height": 900})
        page = ctx.pages[0] if ctx.pages else ctx.new_page()
        page.set_default_timeout(20000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        yield page, errors
        ctx.close()


def login(page, site, key: str):
    page.goto(site["url"] + "/admin/login")
    page.fill("#api_key", key)
    with page.expect_response(lambda r: r.url.endswith("/admin/login") and r.request.method == "POST") as resp:
        page.click("button[type=submit]")
    return resp.value


def test_wrong_key_and_non_admin_key(browser_page, site):
    page, _ = browser_page
    page.context.clear_cookies()
    r = login(page, site, "dia_12345678_wrong-key-wrong-key-wrong")
    assert r.status == 401
    assert "That key is not valid." in page.inner_text("main")
    assert not page.context.cookies()
    r = login(page, site, site["user"])
    assert r.status == 403
    assert "not an admin key" in page.inner_text("main")
    assert not page.context.cookies()
    page.screenshot(path=str(ARTIFACTS / "forbidden.png"))
    page.goto(site["url"] + "/admin")
    assert page.url.endswith("/admin/login")  # still no way in


def canvas_ink(page, selector: str, rgb: tuple[int, int, int]) -> int:
    """Pixels of ``selector``'s canvas close to ``rgb`` (a series' stroke colour)."""
    return page.evaluate("""([sel, rgb]) => {
        const c = document.querySelector(sel);
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4)
            if (d[i + 3] > 200 && Math.abs(d[i] - rgb[0]) < 40 && Math.abs(d[i + 1] - rgb[1]) < 40
                && Math.abs(d[i + 2] - rgb[2]) < 40) n++;
        return n;
    }""", [selector, list(rgb)])


def test_admin_sees_overview_job_transcript_and_cancels_a_queued_job(browser_page, site):
    page, errors = browser_page
    page.context.clear_cookies()
    errors.clear()  # the 401/403 answers of the other test log console errors by design
    r = login(page, site, site["admin"])
    assert r.status == 303
    page.wait_for_url(site["url"] + "/admin")
    [cookie] = page.context.cookies()
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert site["admin"] not in cookie["value"] and site["admin"] not in page.url

    # both charts drawn by uPlot; the throughput line has ink (the demo job finished minutes ago)
    page.wait_for_selector("#chart-throughput canvas")
    page.wait_for_selector("#chart-depth canvas")
    assert canvas_ink(page, "#chart-throughput canvas", (0x2F, 0xB3, 0x80)) > 50
    assert canvas_ink(page, "#chart-depth canvas", (0xC7, 0x7D, 0x0A)) > 50  # the long queue holds our job
    assert page.inner_text("[data-k=queued-long]").strip() != "0"
    assert "tiny" in page.inner_text("#live") or "cpu" in page.inner_text("#live")  # the engine row
    stamp = page.inner_text("#updated")
    page.wait_for_function("s => document.getElementById('updated').textContent !== s", arg=stamp, timeout=12000)
    page.screenshot(path=str(ARTIFACTS / "overview.png"), full_page=True)

    # the jobs table, filtered to completed, leads to the demo job and its transcript
    page.goto(site["url"] + "/admin/jobs?status=completed")
    page.screenshot(path=str(ARTIFACTS / "jobs.png"), full_page=True)
    page.click(f"a[href='/admin/jobs/{site['done']}']")
    page.wait_for_selector("#transcript")
    assert page.inner_text("#job-status") == "completed"
    text = page.inner_text("#transcript")
    assert "S01" in text and "S02" in text and len(text) > 200
    colors = page.evaluate("""() => [...new Set([...document.querySelectorAll('#transcript .spk')]
        .map(e => getComputedStyle(e).backgroundColor))]""")
    assert len(colors) == 2  # two speakers, two colours
    assert page.locator("#timeline rect").count() >= 4
    page.screenshot(path=str(ARTIFACTS / "job_completed.png"), full_page=True)

    # cancel the queued job: button, confirmation page, confirm
    page.goto(site["url"] + f"/admin/jobs/{site['queued']}")
    page.click("#action-cancel")
    page.wait_for_selector("#confirm")
    page.screenshot(path=str(ARTIFACTS / "confirm_cancel.png"))
    page.click("#confirm")
    page.wait_for_url(f"**/admin/jobs/{site['queued']}?flash=*")
    assert page.inner_text("#job-status") == "canceled"
    assert "browser-admin" in page.inner_text("main")  # the audit entry on the job page
    with site["svc"].db.session() as s:
        assert s.get(Job, site["queued"]).status == "canceled"
    page.screenshot(path=str(ARTIFACTS / "job_canceled.png"), full_page=True)
    assert not errors, errors


def screenshot_ink(page, selector: str, colors: list[str]) -> list[int]:
    """Pixels of a screenshot of ``selector`` close to each of ``colors`` (``#rrggbb``; bars are drawn at 85 %
    opacity on a light lane, hence the tolerance). The PNG is decoded by the browser itself (no imaging
    package in the test environment)."""
    import base64

    png = base64.b64encode(page.locator(selector).screenshot()).decode()
    rgbs = [[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in colors]
    return page.evaluate("""async ([b64, rgbs]) => {
        const img = new Image();
        img.src = 'data:image/png;base64,' + b64;
        await img.decode();
        const c = document.createElement('canvas');
        c.width = img.width; c.height = img.height;
        const g = c.getContext('2d');
        g.drawImage(img, 0, 0);
        const d = g.getImageData(0, 0, c.width, c.height).data;
        return rgbs.map(rgb => {
            let n = 0;
            for (let i = 0; i < d.length; i += 4)
                if (Math.abs(d[i] - rgb[0]) < 40 && Math.abs(d[i + 1] - rgb[1]) < 40 && Math.abs(d[i + 2] - rgb[2]) < 40) n++;
            return n;
        });
    }""", [png, rgbs])


def _long_meeting_job(svc) -> str:
    """A completed 90-minute job of four speakers, 1000 segments and overlapping turns, stored as the worker
    stores transcripts (made here: transcribing 90 minutes on the CPU is not a unit test)."""
    from diarist.transcript import Transcript

    segments, turns = [], []
    for i in range(1000):
        start = i * 5.4
        segments.append({"speaker": i % 4, "start": start, "end": start + 4.6, "text": f"segment number {i} says this"})
        turns.append({"speaker": i % 4, "start": start, "end": start + 5.9})  # 0.5 s of overlap with the next
    t = Transcript.from_engine_json({"duration": 5400.0, "language": "en", "model": "tiny.en", "segments": segments,
                                     "turns": turns, "metrics": {}, "finish_reason": "stop"})
    job = Job(status="completed", queue="transcribe.long", duration_s=5400.0, filename="board-meeting.mp3",
              created_at=datetime.now(UTC) - timedelta(hours=1), started_at=datetime.now(UTC) - timedelta(minutes=50),
              finished_at=datetime.now(UTC) - timedelta(minutes=5), progress=1.0, num_speakers=4)
    with svc.db.session() as s:
        s.add(job)
        s.flush()
        job.transcript_key = f"transcripts/{job.id}.json"
        job_id = job.id
    svc.store.put_bytes(f"transcripts/{job_id}.json", t.model_dump_json().encode())
    return job_id


def test_speaker_timeline_draws_lanes_zooms_and_shows_a_bar_text(browser_page, site):
    from diarist.speaker_timeline import OVERLAP_COLOR, PALETTE

    page, errors = browser_page
    page.context.clear_cookies()
    errors.clear()
    assert login(page, site, site["admin"]).status == 303

    # the demo phone call: two speakers, two lanes with ink in their colours
    page.goto(site["url"] + f"/admin/jobs/{site['done']}")
    page.wait_for_selector("#speaker-timeline rect.spk-bar")
    lanes = "() => [...document.querySelectorAll('#speaker-timeline text.spk-lane')].map(t => t.firstChild.nodeValue)"
    assert page.evaluate(lanes) == ["S01", "S02", "overlap"]
    ink = screenshot_ink(page, "#speaker-timeline", list(PALETTE[:2]))
    assert min(ink) > 200, ink
    page.locator("#speakers-card").screenshot(path=str(ARTIFACTS / "speakers_demo.png"))

    # 90 minutes, 1000 segments: every lane drawn, overlaps shown, zoom and click work
    job_id = _long_meeting_job(site["svc"])
    page.goto(site["url"] + f"/admin/jobs/{job_id}")
    page.wait_for_selector("#speaker-timeline rect.spk-bar")
    assert page.locator("#speaker-timeline rect.spk-bar").count() == 1000
    page.locator("#speakers-card").screenshot(path=str(ARTIFACTS / "speakers_90min.png"))
    shown = "() => [...document.querySelectorAll('#speaker-timeline rect.spk-bar')].filter(r => !r.hasAttribute('display')).map(r => +r.dataset.i)"
    assert len(page.evaluate(shown)) == 1000
    for _ in range(6):  # 90 min / 2^6: about 84 s across the plot
        page.click("#spk-zoom-in")
    page.wait_for_function("() => document.getElementById('spk-view').textContent.startsWith('44:')")
    visible = page.evaluate(shown)
    assert 5 <= len(visible) <= 40, len(visible)  # a bar every 5.4 s
    # zoomed in, bars are many pixels wide (at 90 minutes across, one is about a pixel and antialiased)
    ink = screenshot_ink(page, "#speaker-timeline", [*PALETTE[:4], OVERLAP_COLOR])
    assert min(ink) > 200, ink
    page.locator(f"#speaker-timeline rect.spk-bar[data-i='{visible[2]}']").click()
    assert f"segment number {visible[2]} says this" in page.inner_text("#spk-detail")
    page.locator("#speakers-card").screenshot(path=str(ARTIFACTS / "speakers_90min_zoomed.png"))
    page.click("#spk-fit")
    page.wait_for_function("() => document.getElementById('spk-view').textContent.startsWith('00:00–1:30:00')")
    assert len(page.evaluate(shown)) == 1000
    assert not errors, errors
