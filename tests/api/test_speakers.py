"""Known speakers on the embedded stack (real tiny.en engine, real CAM++, SQLite, local store, loopback HTTP):
voice profiles, identification in jobs, naming after the fact, bad input, and tenant isolation per route."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import func, select

from tests.api.conftest import wait_final
from tests.conftest import data_file, noise_wav, pcm16_wav, wav_bytes

READER = "en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav"  # one talker, 8.7 s
OTHER = "en_librispeech_1272-128104-0000_picovoice/test.wav"  # another talker, 5.9 s
JFK = "en_jfk_inaugural/jfk.flac"  # a third, 11 s


def _upload(client, name: str | None, *paths, headers=None, url="/v1/speakers", method="POST"):
    files = [("file", (p.name, p.read_bytes(), "application/octet-stream")) if hasattr(p, "read_bytes")
             else ("file", ("clip.wav", p, "audio/wav")) for p in paths]
    data = {"name": name} if name is not None else {}
    return client.request(method, url, data=data, files=files, headers=headers or {})


def _job(client, path, headers=None, **options) -> dict:
    r = client.post("/v1/jobs", files={"file": (path.name, path.read_bytes())},
                    data={k: v for k, v in options.items()}, headers=headers or {})
    assert r.status_code == 202, r.text
    job = wait_final(client, r.json()["id"], headers=headers)
    assert job["status"] == "completed", job
    return job


@pytest.fixture(scope="module")
def reader(stack):
    """A profile enrolled from one clip, in the no-auth space of the module's stack."""
    import httpx

    with httpx.Client(base_url=stack.url, timeout=120) as c:
        r = _upload(c, "  Reader   One ", data_file(READER))
        assert r.status_code == 201, r.text
        return r.json()


def test_profile_from_an_upload(client, reader):
    assert reader["name"] == "Reader One"  # whitespace collapsed
    assert reader["id"].startswith("spk_") and reader["model"].startswith("campplus@")
    assert reader["sample_count"] == 1 and reader["sample_seconds"] >= 3.0
    assert reader["samples"][0]["source"] == "upload"
    assert "vector" not in reader and "vector" not in reader["samples"][0]  # vectors never leave the server
    got = client.get(f"/v1/speakers/{reader['id']}").json()
    assert got == reader
    listed = client.get("/v1/speakers").json()
    assert listed["object"] == "list" and reader["id"] in [p["id"] for p in listed["data"]]


def test_a_job_names_the_enrolled_voice_in_every_export(client, reader):
    job = _job(client, data_file(READER), speaker_profiles="all")
    assert job["options"]["speaker_profiles"] == "all"
    t = client.get(f"/v1/jobs/{job['id']}/transcript").json()
    ident = t["identities"]["S01"]
    assert ident["name"] == "Reader One" and ident["profile_id"] == reader["id"]
    assert ident["match_score"] >= 0.9  # the enrollment clip itself
    for fmt, shown in (("txt", "Reader One: "), ("srt", "Reader One: "), ("vtt", "<v Reader One>"),
                       ("rttm", " Reader_One "), ("verbose_json", '"speaker":"Reader One"'),
                       ("diarized_json", '"speaker":"Reader One"')):
        body = client.get(f"/v1/jobs/{job['id']}/transcript", params={"format": fmt}).text.replace(": ", ":")
        assert shown.replace(": ", ":") in body, (fmt, body[:300])


def test_an_unknown_voice_is_never_forced_onto_a_profile(client, reader):
    job = _job(client, data_file(OTHER), speaker_profiles=reader["id"])
    t = client.get(f"/v1/jobs/{job['id']}/transcript").json()
    assert t["identities"] and all(x["name"] is None and x["profile_id"] is None for x in t["identities"].values())
    assert "Reader One" not in client.get(f"/v1/jobs/{job['id']}/transcript", params={"format": "txt"}).text


def test_openai_route_takes_speaker_profiles(client, reader):
    r = client.post("/v1/audio/transcriptions", data={"model": "whisper-1", "response_format": "diarized_json",
                                                      "speaker_profiles": reader["id"]},
                    files={"file": ("a.wav", data_file(READER).read_bytes())})
    assert r.status_code == 200, r.text
    assert {s["speaker"] for s in r.json()["segments"]} == {"Reader One"}


def test_profile_from_a_job_speaker_and_naming_after_the_fact(client, stack):
    job = _job(client, data_file(JFK))
    r = client.post("/v1/speakers", json={"name": "JFK", "job_id": job["id"], "speaker": "S01"})
    assert r.status_code == 201, r.text
    jfk = r.json()
    assert jfk["samples"][0]["source"] == f"job:{job['id']}:S01"
    # a label the job does not have; a job that does not exist
    assert client.post("/v1/speakers", json={"name": "X", "job_id": job["id"], "speaker": "S09"}
                       ).json()["error"]["code"] == "unknown_speaker"
    assert client.post("/v1/speakers", json={"name": "X", "job_id": "job_nope", "speaker": "S01"}
                       ).status_code == 404
    # naming after the fact: every export follows, and the voice is saved into the existing profile
    r = client.patch(f"/v1/jobs/{job['id']}/speakers", json={"S01": "John F. Kennedy", "save_profile": True})
    assert r.status_code == 200, r.text
    assert r.json()["identities"]["S01"]["name"] == "John F. Kennedy"
    txt = client.get(f"/v1/jobs/{job['id']}/transcript", params={"format": "txt"}).text
    assert "John F. Kennedy: " in txt and "S01" not in txt
    saved = r.json()["identities"]["S01"]["profile_id"]
    assert saved != jfk["id"]  # a new name: a new profile
    assert client.get(f"/v1/speakers/{saved}").json()["name"] == "John F. Kennedy"
    # renaming to the name of a profile adds the voice to that profile
    r = client.patch(f"/v1/jobs/{job['id']}/speakers", json={"S01": "JFK", "save_profile": True})
    assert r.json()["identities"]["S01"]["profile_id"] == jfk["id"]
    assert client.get(f"/v1/speakers/{jfk['id']}").json()["sample_count"] == 1  # the same job speaker: once
    created = client.get(f"/v1/speakers/{saved}").json()
    assert created["updated_at"] >= created["created_at"]
    # bad requests change nothing
    before = client.get(f"/v1/jobs/{job['id']}/transcript").json()
    assert client.patch(f"/v1/jobs/{job['id']}/speakers", json={"S07": "Nobody"}
                        ).json()["error"]["code"] == "unknown_speaker"
    assert client.patch(f"/v1/jobs/{job['id']}/speakers", json={"S01": 5}).status_code == 422
    assert client.patch(f"/v1/jobs/{job['id']}/speakers", json={"save_profile": True}).status_code == 422
    assert client.get(f"/v1/jobs/{job['id']}/transcript").json() == before
    # rename and delete
    r = client.patch(f"/v1/speakers/{saved}", json={"name": "Jack Kennedy"})
    assert r.status_code == 200 and r.json()["name"] == "Jack Kennedy"
    assert client.patch(f"/v1/speakers/{saved}", json={"name": "JFK"}).json()["error"]["code"] == "duplicate_name"
    _deleted_with_its_samples(client, stack, saved)
    # deleting the job deletes its speakers' voices with its audio and transcript
    from diarist.storage import ObjectNotFound
    from diarist.voice_profiles import voices_key

    assert stack.services.store.get_bytes(voices_key(job["id"]))
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 200
    with pytest.raises(ObjectNotFound):
        stack.services.store.get_bytes(voices_key(job["id"]))


def test_a_job_that_is_not_completed_has_no_speakers_yet(client, stack):
    from datetime import UTC, datetime, timedelta

    from diarist.models import Job

    with stack.services.db.session() as s:
        job = Job(status="processing", owner_key="", duration_s=5.0,
                  lease_expires_at=datetime.now(UTC) + timedelta(hours=1))
        s.add(job)
    for r in (client.post("/v1/speakers", json={"name": "Early", "job_id": job.id, "speaker": "S01"}),
              client.patch(f"/v1/jobs/{job.id}/speakers", json={"S01": "Early"})):
        assert (r.status_code, r.json()["error"]["code"]) == (409, "not_ready")
    with stack.services.db.session() as s:
        s.delete(s.get(Job, job.id))


def _deleted_with_its_samples(client, stack, pid: str) -> None:
    from diarist.models import SpeakerProfile, SpeakerSample

    assert client.delete(f"/v1/speakers/{pid}").json() == {"id": pid, "object": "speaker_profile", "deleted": True}
    assert client.get(f"/v1/speakers/{pid}").status_code == 404
    with stack.services.db.session() as s:
        assert s.get(SpeakerProfile, pid) is None
        assert s.scalar(select(func.count()).select_from(SpeakerSample).where(SpeakerSample.profile_id == pid)) == 0


def test_bad_samples_get_a_code_and_change_nothing(client, app_with, reader, tmp_path):
    def count() -> int:
        return len(client.get("/v1/speakers").json()["data"])

    n = count()
    cases = [
        (_upload(client, "Silence", wav_bytes(4.0)), 422, "no_speech"),
        (_upload(client, "Noise", noise_wav(4.0, seed=1)), 422, "no_speech"),
        (_upload(client, "Yes", data_file("en_short_yes/yes_1000ms.wav")), 422, "too_little_speech"),
        (_upload(client, "Garbage", b"definitely not audio"), 422, "decode_failed"),
        (_upload(client, "Reader One", data_file(READER)), 409, "duplicate_name"),
        (_upload(client, "", data_file(READER)), 422, "invalid_request"),
        (_upload(client, "No file"), 415, "unsupported_media_type"),  # no file: not even multipart
        (client.post("/v1/speakers", content=b"x", headers={"content-type": "text/plain"}), 415,
         "unsupported_media_type"),
    ]
    for r, status, code in cases:
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    short = app_with(speaker_sample_max_s=2.0)
    r = _upload(short, "Long", data_file(READER))
    assert (r.status_code, r.json()["error"]["code"]) == (422, "too_long")
    limited = app_with(max_speaker_profiles=count())
    r = _upload(limited, "One too many", data_file(OTHER))
    assert (r.status_code, r.json()["error"]["code"]) == (409, "profile_limit")
    r = client.post("/v1/jobs", files={"file": ("a.wav", wav_bytes(1.0))}, data={"speaker_profiles": "spk_nope"})
    assert (r.status_code, r.json()["error"]["code"]) == (422, "unknown_profile")
    assert count() == n


def test_a_sample_of_two_clips_adds_their_speech(client):
    r = _upload(client, "Two clips", pcm16_wav((np.zeros(8000)).astype(np.int16)), data_file(OTHER))
    assert (r.status_code, r.json()["error"]["code"]) == (422, "no_speech")  # every clip must hold speech
    r = _upload(client, "Two clips", data_file(OTHER), data_file(OTHER))
    assert r.status_code == 201 and r.json()["sample_count"] == 2
    r = _upload(client, None, data_file(OTHER), url=f"/v1/speakers/{r.json()['id']}", method="PATCH")
    assert r.status_code == 200 and r.json()["sample_count"] == 3


def test_every_route_is_tenant_isolated(app_with, stack):
    from diarist.apikeys import create_key

    db = stack.services.db
    alice, bob = create_key(db, "alice-spk"), create_key(db, "bob-spk")
    root = create_key(db, "root-spk", admin=True)
    a, b = ({"Authorization": f"Bearer {k.token}"} for k in (alice, bob))
    c = app_with(auth=True)
    r = _upload(c, "Alice's reader", data_file(READER), headers=a)
    assert r.status_code == 201, r.text
    pid = r.json()["id"]
    job = _job(c, data_file(READER), headers=a)
    for who in (b, {"Authorization": f"Bearer {root.token}"}):  # another key, admin included
        assert pid not in [p["id"] for p in c.get("/v1/speakers", headers=who).json()["data"]]
        assert c.get(f"/v1/speakers/{pid}", headers=who).status_code == 404
        assert c.patch(f"/v1/speakers/{pid}", json={"name": "Taken"}, headers=who).status_code == 404
        assert c.delete(f"/v1/speakers/{pid}", headers=who).status_code == 404
        r = c.post("/v1/speakers", json={"name": "Stolen", "job_id": job["id"], "speaker": "S01"}, headers=who)
        assert r.status_code == 404
        r = c.post("/v1/jobs", files={"file": ("a.wav", wav_bytes(1.0))}, data={"speaker_profiles": pid},
                   headers=who)
        assert (r.status_code, r.json()["error"]["code"]) == (422, "unknown_profile")
        r = c.post("/v1/audio/transcriptions", data={"model": "whisper-1", "speaker_profiles": pid},
                   files={"file": ("a.wav", wav_bytes(1.0))}, headers=who)
        assert (r.status_code, r.json()["error"]["code"]) == (422, "unknown_profile")
    assert c.patch(f"/v1/jobs/{job['id']}/speakers", json={"S01": "X"}, headers=b).status_code == 404
    # a name taken by another key is free for this one; "all" never reaches another key's profiles
    assert _upload(c, "Alice's reader", data_file(OTHER), headers=b).status_code == 201
    bob_job = _job(c, data_file(READER), headers=b, speaker_profiles="all")
    t = c.get(f"/v1/jobs/{bob_job['id']}/transcript", headers=b).json()
    assert all(x["profile_id"] != pid for x in t["identities"].values())
    assert c.get(f"/v1/speakers/{pid}", headers=a).json()["name"] == "Alice's reader"
    assert c.get("/v1/speakers").status_code == 401


def test_engine_server_embeds_a_sample_over_http(stack):
    """Split deployment: the API reaches the engine server's POST /internal/embed (no model in the API)."""
    import threading

    import uvicorn

    from engine_server.client import HttpEngineClient, JobFailure
    from engine_server.server import create_engine_app
    from tests.servers import free_port, wait_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_engine_app(stack.engine, engine_id="embed-test"),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_port(port)
        http = HttpEngineClient(f"http://127.0.0.1:{port}")
        voice, duration = http.sample_voice(data_file(READER), 300.0)
        local, _ = stack.services.voices.sample_voice(data_file(READER), 300.0)
        assert duration == pytest.approx(8.73, abs=0.01)
        assert voice.model == local.model and voice.speech_s == local.speech_s
        assert float(np.dot(voice.vector, local.vector)) > 0.999  # the same model on the same samples
        with pytest.raises(JobFailure) as e:
            http.sample_voice(data_file(READER), 2.0)
        assert e.value.code == "too_long"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
