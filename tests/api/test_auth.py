"""API keys: Bearer auth, per-key job scoping (another key's job is 404), admin sees all."""

from __future__ import annotations

import pytest

from diarist.apikeys import authenticate, create_key, revoke_key
from tests.conftest import data_file


@pytest.fixture(scope="module")
def keys(stack):
    db = stack.services.db
    return {"alice": create_key(db, "alice"), "bob": create_key(db, "bob"), "root": create_key(db, "root", admin=True)}


def bearer(k) -> dict:
    return {"Authorization": f"Bearer {k.token}"}


def test_token_is_stored_hashed(stack, keys):
    from sqlalchemy import select

    from diarist.models import ApiKey

    with stack.services.db.session() as s:
        row = s.scalar(select(ApiKey).where(ApiKey.id == keys["alice"].id))
        assert keys["alice"].token not in (row.secret_hash, row.prefix) and len(row.secret_hash) == 64
    assert authenticate(stack.services.db, keys["alice"].token).id == keys["alice"].id
    assert authenticate(stack.services.db, keys["alice"].token + "x") is None
    assert authenticate(stack.services.db, "dia_nope_nope") is None


def test_requests_without_a_valid_key_are_401(app_with):
    c = app_with(auth=True)
    r = c.get("/v1/jobs")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    assert c.get("/v1/jobs", headers={"Authorization": "Bearer dia_00000000_wrong"}).status_code == 401
    assert c.get("/healthz").status_code == 200  # probes stay open


def test_a_key_sees_only_its_own_jobs(app_with, keys, stack):
    c = app_with(auth=True)
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    r = c.post("/v1/jobs", files={"file": ("y.wav", wav)}, headers=bearer(keys["alice"]))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert c.get(f"/v1/jobs/{job_id}", headers=bearer(keys["alice"])).status_code == 200
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/transcript", f"/v1/jobs/{job_id}/events"):
        r = c.get(path, headers=bearer(keys["bob"]))
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", path
    assert c.delete(f"/v1/jobs/{job_id}", headers=bearer(keys["bob"])).status_code == 404
    bob_list = c.get("/v1/jobs", headers=bearer(keys["bob"])).json()["data"]
    assert job_id not in [j["id"] for j in bob_list]
    assert job_id in [j["id"] for j in c.get("/v1/jobs", headers=bearer(keys["alice"])).json()["data"]]
    assert c.get(f"/v1/jobs/{job_id}", headers=bearer(keys["root"])).status_code == 200
    # The same Idempotency-Key under two keys names two different jobs.
    h = {"Idempotency-Key": "same"}
    a = c.post("/v1/jobs", files={"file": ("y.wav", wav)}, headers={**bearer(keys["alice"]), **h}).json()
    b = c.post("/v1/jobs", files={"file": ("y.wav", wav)}, headers={**bearer(keys["bob"]), **h}).json()
    assert a["id"] != b["id"]


def test_revoked_key_is_refused(app_with, stack):
    c = app_with(auth=True)
    k = create_key(stack.services.db, "temp")
    assert c.get("/v1/jobs", headers=bearer(k)).status_code == 200
    assert revoke_key(stack.services.db, k.id)
    assert c.get("/v1/jobs", headers=bearer(k)).status_code == 401


def test_the_speaker_timeline_image_follows_the_tenant_rules_of_every_format(app_with, keys, wait_job):
    """``format=svg`` is the owner's (and an admin's) like every transcript format; another key gets 404."""
    import xml.etree.ElementTree as ET

    c = app_with(auth=True)
    wav = data_file("en_jfk_inaugural/jfk.flac").read_bytes()
    job_id = c.post("/v1/jobs", files={"file": ("jfk.flac", wav)}, headers=bearer(keys["alice"])).json()["id"]
    r = c.get(f"/v1/jobs/{job_id}/transcript?format=svg", headers=bearer(keys["alice"]))
    assert r.status_code == 409 or r.headers["content-type"].startswith("image/svg+xml")  # not ready yet, or done
    assert wait_job(c, job_id, headers=bearer(keys["alice"]))["status"] == "completed"
    for who in ("alice", "root"):
        r = c.get(f"/v1/jobs/{job_id}/transcript?format=svg", headers=bearer(keys[who]))
        assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml; charset=utf-8", who
        root = ET.fromstring(r.text)
        assert "S01" in [e.text for e in root.iter("{http://www.w3.org/2000/svg}text")]
    r = c.get(f"/v1/jobs/{job_id}/transcript?format=svg", headers=bearer(keys["bob"]))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = c.get(f"/v1/jobs/{job_id}/transcript?format=png", headers=bearer(keys["alice"]))
    assert r.status_code == 422  # one list of formats (diarist.formats.SUPPORTED_FORMATS); png is not in it
