"""/admin over the embedded stack with auth on: login and sessions, access rules, CSRF, job pages, and the
confirmed, audited actions (cancel, retry through the real worker and engine, delete, redeliver a webhook)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlparse

import pytest
from fastapi.testclient import TestClient

from diarist import audit
from diarist.apikeys import create_key, revoke_key
from diarist.models import Job, JobMetrics, WebhookDelivery
from diarist.storage import ObjectNotFound
from diarist.transcript import Segment, Transcript
from tests.api.conftest import services_with
from tests.conftest import data_file


@pytest.fixture(scope="module")
def env(stack):
    """An auth-on app over the stack's database, store, bus and queue, with one admin and one client key."""
    from api.app import create_app

    svc = services_with(stack, auth=True)
    app = create_app(svc)
    app.state.engine_stats = stack.app.state.engine_stats
    admin = create_key(svc.db, "ops-admin", admin=True)
    user = create_key(svc.db, "client-app")
    return {"app": app, "svc": svc, "admin": admin, "user": user}


def browser(env) -> TestClient:
    # https: the session cookie is Secure, and a cookie jar does not send it over plain http
    return TestClient(env["app"], base_url="https://testserver", raise_server_exceptions=False)


def logged_in(env) -> TestClient:
    c = browser(env)
    r = c.post("/admin/login", data={"api_key": env["admin"].token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/admin"
    return c


def csrf(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def add_job(svc, **fields) -> str:
    now = datetime.now(UTC)
    fields.setdefault("created_at", now - timedelta(seconds=30))
    fields.setdefault("updated_at", now)
    # an active row's lease (or pickup deadline) not yet passed: the sweeper leaves it to the test
    fields.setdefault("lease_expires_at", now + timedelta(hours=1))
    job = Job(**fields)
    with svc.db.session() as s:
        s.add(job)
    return job.id


def act(c: TestClient, job_id: str, action: str):
    """The operator's two steps: open the confirmation page, then press its button."""
    page = c.get(f"/admin/jobs/{job_id}/confirm/{action}")
    assert page.status_code == 200 and 'id="confirm"' in page.text
    return c.post(f"/admin/jobs/{job_id}/{action}", data={"csrf": csrf(page.text)}, follow_redirects=False)


def status_of(svc, job_id: str) -> str | None:
    with svc.db.session() as s:
        job = s.get(Job, job_id)
        return None if job is None else job.status


def test_login_sets_a_signed_secure_cookie_and_never_puts_the_key_in_a_url(env):
    c = browser(env)
    r = c.get("/admin", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/admin/login"
    r = c.post("/admin/login", data={"api_key": env["admin"].token}, follow_redirects=False)
    assert r.status_code == 303 and env["admin"].token not in r.headers["location"]
    cookie = r.headers["set-cookie"]
    for attr in ("HttpOnly", "Secure", "SameSite=strict", "Path=/admin"):
        assert attr.lower() in cookie.lower(), cookie
    value = r.cookies["diarist_admin"]
    secret = env["admin"].token.split("_", 2)[2]  # the whole secret: token_urlsafe may itself contain "_"
    assert env["admin"].token not in value and secret not in value
    page = c.get("/admin")
    assert page.status_code == 200 and "ops-admin" in page.text and 'id="chart-throughput"' in page.text


def test_wrong_key_and_non_admin_key_cannot_get_in(env):
    c = browser(env)
    r = c.post("/admin/login", data={"api_key": "dia_00000000_not-a-real-key"}, follow_redirects=False)
    assert r.status_code == 401 and "not valid" in r.text and "diarist_admin" not in r.cookies
    r = c.post("/admin/login", data={"api_key": env["user"].token}, follow_redirects=False)
    assert r.status_code == 403 and "not an admin key" in r.text and "diarist_admin" not in r.cookies
    assert c.get("/admin", follow_redirects=False).status_code == 303
    # the same rules for scripts using a Bearer key
    hdr = {"Authorization": f"Bearer {env['user'].token}"}
    assert c.get("/admin/api/overview", headers=hdr).status_code == 403
    assert c.get("/admin", headers=hdr).status_code == 403
    assert c.get("/admin/api/overview").status_code == 401
    ok = c.get("/admin/api/overview", headers={"Authorization": f"Bearer {env['admin'].token}"})
    assert ok.status_code == 200 and set(ok.json()) >= {"queues", "running", "finished", "engines", "series"}
    denied = [e for e in audit.recent(env["svc"].db, 20) if e["action"] == "login" and e["outcome"] == "denied"]
    assert {e["detail"] for e in denied} >= {"invalid or revoked key", "not an admin key"}


def test_forged_expired_and_revoked_sessions_are_refused(env):
    from api.admin import session

    c = logged_in(env)
    good = c.cookies.get("diarist_admin")
    key_id, expires, sig = good.split(".")

    def gets_in(value: str) -> bool:
        fresh = browser(env)
        return fresh.get("/admin", headers={"Cookie": f"diarist_admin={value}"},
                         follow_redirects=False).status_code == 200

    assert gets_in(good)
    assert not gets_in(f"{env['user'].id}.{expires}.{sig}")  # another key id under the same signature
    assert not gets_in(f"{key_id}.{int(expires) + 3600}.{sig}")  # a longer life
    assert not gets_in(f"{key_id}.{expires}.{sig[:-2]}AA")
    req = type("R", (), {"app": env["app"]})()
    old, _ttl = session.make_cookie(req, key_id, now=time.time() - 2 * 86400)  # correctly signed, expired
    assert not gets_in(old)
    other = create_key(env["svc"].db, "temp-admin", admin=True)
    c2 = browser(env)
    c2.post("/admin/login", data={"api_key": other.token}, follow_redirects=False)
    assert c2.get("/admin", follow_redirects=False).status_code == 200
    revoke_key(env["svc"].db, other.id)
    assert c2.get("/admin", follow_redirects=False).status_code == 303


def test_actions_need_the_forms_csrf_token(env):
    c = logged_in(env)
    jid = add_job(env["svc"], status="queued", queue="transcribe.short", duration_s=5.0)
    r = c.post(f"/admin/jobs/{jid}/cancel", data={"csrf": "forged"}, follow_redirects=False)
    assert r.status_code == 403 and status_of(env["svc"], jid) == "queued"
    assert act(c, jid, "cancel").status_code == 303
    assert status_of(env["svc"], jid) == "canceled"


def test_cancel_a_queued_job_is_audited_with_who_and_when(env):
    c = logged_in(env)
    jid = add_job(env["svc"], status="queued", queue="transcribe.long", duration_s=900.0)
    before = datetime.now(UTC)
    r = act(c, jid, "cancel")
    assert r.status_code == 303 and r.headers["location"].startswith(f"/admin/jobs/{jid}?")
    assert "ok" in parse_qs(urlparse(r.headers["location"]).query)["flash"][0]
    assert status_of(env["svc"], jid) == "canceled"
    [entry] = audit.recent(env["svc"].db, target_id=jid)
    assert (entry["action"], entry["outcome"], entry["actor_name"]) == ("cancel", "ok", "ops-admin")
    assert entry["actor_key_id"] == env["admin"].id
    at = entry["at"] if entry["at"].tzinfo else entry["at"].replace(tzinfo=UTC)
    assert before - timedelta(seconds=1) <= at <= datetime.now(UTC)
    # a second cancel does nothing, and says so (the confirm page no longer offers it)
    page = c.get(f"/admin/jobs/{jid}/confirm/cancel")
    assert 'id="confirm"' not in page.text and "does not apply" in page.text
    detail = c.get(f"/admin/jobs/{jid}")
    assert "ops-admin" in detail.text and 'id="action-cancel"' not in detail.text


def test_retry_a_failed_job_runs_it_again_through_the_worker_and_engine(env):
    svc = env["svc"]
    jid = add_job(svc, status="failed", queue="transcribe.short", duration_s=1.0, attempts=3,
                  error_code="engine_error", error_message="engine server unreachable", model="whisper",
                  finished_at=datetime.now(UTC))
    with open(data_file("en_short_yes/yes_1000ms.wav"), "rb") as f:
        svc.store.put_file(f"jobs/{jid}/audio", f)
    with svc.db.session() as s:
        s.get(Job, jid).audio_key = f"jobs/{jid}/audio"
    c = logged_in(env)
    r = act(c, jid, "retry")
    assert r.status_code == 303
    deadline = time.monotonic() + 120
    while status_of(svc, jid) not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.1)
    with svc.db.session() as s:
        job = s.get(Job, jid)
        assert job.status == "completed", (job.error_code, job.error_message)
        assert job.attempts == 1 and job.error_code is None and job.metrics.rtf > 0
    page = c.get(f"/admin/jobs/{jid}")
    assert "engine wait" in page.text or "encoding" in page.text  # the timeline has engine phases now
    assert [e["action"] for e in audit.recent(svc.db, target_id=jid)] == ["retry"]
    # only failed jobs can be retried: a POST on a completed one is a no-op, audited as such
    r = c.post(f"/admin/jobs/{jid}/retry", data={"csrf": csrf(page.text)}, follow_redirects=False)
    assert "noop" in parse_qs(urlparse(r.headers["location"]).query)["flash"][0]
    assert audit.recent(svc.db, target_id=jid)[0]["outcome"] == "noop"


def test_delete_removes_row_and_objects_but_keeps_the_audit_entry(env):
    svc = env["svc"]
    jid = add_job(svc, status="completed", queue="transcribe.short", duration_s=3.0,
                  transcript_key=None, finished_at=datetime.now(UTC))
    svc.store.put_bytes(f"jobs/{jid}/audio", b"RIFF....")
    r = act(logged_in(env), jid, "delete")
    assert r.status_code == 303 and r.headers["location"].startswith("/admin/jobs?")
    assert status_of(svc, jid) is None
    with pytest.raises(ObjectNotFound):
        svc.store.get_bytes(f"jobs/{jid}/audio")
    [entry] = audit.recent(svc.db, target_id=jid)
    assert entry["action"] == "delete" and entry["outcome"] == "ok"


def test_redeliver_sends_the_webhook_again_and_records_the_attempt(env, receiver):
    svc = env["svc"]
    hook = receiver()
    jid = add_job(svc, status="completed", queue="transcribe.short", duration_s=3.0, webhook_url=hook.url,
                  webhook_status="failed", webhook_status_code=500, finished_at=datetime.now(UTC))
    r = act(logged_in(env), jid, "redeliver")
    assert r.status_code == 303
    [(headers, body)] = hook.wait(1, timeout_s=30)
    assert b'"id":"' + jid.encode() in body and headers["webhook-id"].startswith("msg_")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with svc.db.session() as s:
            job = s.get(Job, jid)
            if job.webhook_status == "delivered":
                break
        time.sleep(0.05)
    assert job.webhook_status == "delivered" and job.webhook_status_code == 200
    assert audit.recent(svc.db, target_id=jid)[0]["action"] == "redeliver"


def test_job_detail_shows_metadata_metrics_transcript_and_deliveries(env):
    svc = env["svc"]
    now = datetime.now(UTC)
    tr = Transcript(duration=20.0, model="whisper", speakers=["S01", "S02"], finish_reason="length",
                    coverage=0.6, incomplete=True, incomplete_reason="the token budget ran out at 12.0 s",
                    segments=[Segment(id=0, speaker="S01", start=0.0, end=5.5, text="Hello there, how are you?"),
                              Segment(id=1, speaker="S02", start=6.0, end=12.0, text="Fine <b>thanks</b>.")])
    jid = add_job(svc, status="completed", queue="transcribe.short", duration_s=20.0, filename="call.wav",
                  created_at=now - timedelta(seconds=40), started_at=now - timedelta(seconds=30), finished_at=now,
                  incomplete=True, webhook_url="https://example.invalid/hook", webhook_status="failed")
    svc.store.put_bytes(f"jobs/{jid}/transcript-1.json", tr.model_dump_json().encode())
    with svc.db.session() as s:
        s.get(Job, jid).transcript_key = f"jobs/{jid}/transcript-1.json"
        s.add(JobMetrics(job_id=jid, queue_wait_s=1.0, encoder_s=4.0, prefill_s=2.0, decode_s=13.0,
                         processing_s=29.0, rtf=1.45, finish_reason="length", coverage=0.6, engine_id="e-test"))
        s.add(WebhookDelivery(job_id=jid, message_id="msg_x", attempt=1, url="https://example.invalid/hook",
                              event="job.completed", status_code=503, duration_s=0.2))
    html = logged_in(env).get(f"/admin/jobs/{jid}").text
    assert "call.wav" in html and "e-test" in html and "1.4500" in html and "60.0%" in html
    assert "the token budget ran out at 12.0 s" in html and ">length<" in html
    assert 'class="spk spk-0">S01' in html and 'class="spk spk-1">S02' in html
    assert "Hello there, how are you?" in html
    assert "Fine &lt;b&gt;thanks&lt;/b&gt;." in html  # transcript text is escaped
    assert "503" in html and "msg_x" in html
    # the timeline: 10 s queued, then engine wait 1, encoding 4, prefill 2, decode 13, stored 10 (of 30 s)
    names = re.findall(r"<title>([a-z ]+): ", html)
    assert names == ["queued", "engine wait", "encoding", "prefill", "decode", "stored"]
    txt = logged_in(env).get(f"/admin/jobs/{jid}/transcript", params={"format": "txt"})
    assert txt.status_code == 200 and "Hello there" in txt.text


def test_jobs_table_filters_and_search(env):
    svc = env["svc"]
    jid = add_job(svc, status="failed", queue="transcribe.long", duration_s=300.0, owner_key=env["user"].id,
                  error_code="decode_failed")
    c = logged_in(env)
    html = c.get("/admin/jobs", params={"status": "failed", "cls": "long", "key": env["user"].id}).text
    assert jid in html and "decode_failed" in html and "client-app" in html
    assert jid not in c.get("/admin/jobs", params={"status": "completed"}).text
    assert jid in c.get("/admin/jobs", params={"q": jid[4:14]}).text  # id prefix, without "job_"
    assert jid not in c.get("/admin/jobs", params={"q": "ffffffffffff"}).text
    assert c.get("/admin/jobs", params={"status": "bogus", "page": 99}).status_code == 200


def test_static_assets_are_local_and_contained(env):
    c = browser(env)
    assert c.get("/admin/static/vendor/uplot/uPlot.iife.min.js").status_code == 200
    assert c.get("/admin/static/admin.css").headers["content-type"].startswith("text/css")
    assert c.get("/admin/static/../../app.py").status_code == 404
    assert c.get("/admin/static/%2e%2e/%2e%2e/app.py").status_code == 404
    html = logged_in(env).get("/admin").text
    assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing from another origin


def test_logout_ends_the_browser_session_and_is_audited(env):
    c = logged_in(env)
    page = c.get("/admin")
    r = c.post("/admin/logout", data={"csrf": csrf(page.text)}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/admin/login"
    assert "max-age=0" in r.headers["set-cookie"].lower()
    assert c.get("/admin", follow_redirects=False).status_code == 303
    last = audit.recent(env["svc"].db, 1)[0]
    assert (last["action"], last["actor_name"]) == ("logout", "ops-admin")


def test_with_auth_off_the_dashboard_is_open_like_the_api(stack, client):
    r = client.get("/admin")
    assert r.status_code == 200 and "anonymous (auth off)" in r.text
    assert client.get("/admin/login", follow_redirects=False).status_code == 303


def test_a_transcript_of_random_weights_says_so_in_every_format(env):
    """Random weights are visible on every route (issue 33 item 5): the jobs route's text formats carry the
    X-Diarist-Random-Weights header, its JSON the field."""
    svc = env["svc"]
    tr = Transcript(duration=2.0, model="moss-td-dummy", speakers=["S01"], finish_reason="stop", random_weights=True,
                    segments=[Segment(id=0, speaker="S01", start=0.0, end=1.0, text="noise")])
    jid = add_job(svc, status="completed", queue="transcribe.short", duration_s=2.0, finished_at=datetime.now(UTC))
    svc.store.put_bytes(f"jobs/{jid}/transcript-1.json", tr.model_dump_json().encode())
    with svc.db.session() as s:
        s.get(Job, jid).transcript_key = f"jobs/{jid}/transcript-1.json"
    c = TestClient(env["app"])
    hdr = {"Authorization": f"Bearer {env['admin'].token}"}
    for fmt in ("json", "srt", "txt"):
        r = c.get(f"/v1/jobs/{jid}/transcript", params={"format": fmt}, headers=hdr)
        assert r.status_code == 200 and r.headers["x-diarist-random-weights"] == "true", (fmt, r.text)
    assert c.get(f"/v1/jobs/{jid}/transcript", headers=hdr).json()["random_weights"] is True


def test_job_detail_shows_speaker_names_scores_and_the_keys_profiles(env):
    from diarist.models import SpeakerProfile
    from diarist.transcript import SpeakerIdentity

    svc, owner = env["svc"], env["user"].id
    with svc.db.session() as s:
        s.add(SpeakerProfile(id="spk_admin_test", owner_key=owner, name="Ada Lovelace", model="campplus@x",
                             vector=[1.0], sample_count=2, sample_seconds=12.5))
        s.add(SpeakerProfile(id="spk_other_key", owner_key="key_someone_else", name="Not Shown", model="campplus@x",
                             vector=[1.0]))
    tr = Transcript(duration=10.0, model="whisper", speakers=["S01", "S02"],
                    segments=[Segment(id=0, speaker="S01", start=0.0, end=4.0, text="Good morning."),
                              Segment(id=1, speaker="S02", start=4.5, end=8.0, text="Morning.")],
                    identities={"S01": SpeakerIdentity(name="Ada Lovelace", profile_id="spk_admin_test",
                                                       match_score=0.8123),
                                "S02": SpeakerIdentity()})
    jid = add_job(svc, status="completed", owner_key=owner, queue="transcribe.short", duration_s=10.0)
    svc.store.put_bytes(f"jobs/{jid}/transcript-1.json", tr.model_dump_json().encode())
    with svc.db.session() as s:
        s.get(Job, jid).transcript_key = f"jobs/{jid}/transcript-1.json"
    html = logged_in(env).get(f"/admin/jobs/{jid}").text
    assert "S01 · Ada Lovelace" in html and "(0.81)" in html and "S02 · <span class=\"small\">unknown voice" in html
    assert 'class="spk spk-0">Ada Lovelace</span>' in html  # the segments show the name
    profiles = html.split('id="profiles"', 1)[1].split("</section>", 1)[0]
    assert "Ada Lovelace" in profiles and "spk_admin_test" in profiles and "Not Shown" not in profiles
