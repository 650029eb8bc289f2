"""Bad input through the API: 4xx with a machine code and a message, and the service keeps serving."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from tests.conftest import data_file, pcm16_wav
from transcription.limits import MIN_DURATION_S


def video_without_audio() -> bytes:
    """A real MP4 with one video stream and no audio stream (made with PyAV)."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(10):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 20, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def mp3_head(n: int) -> bytes:
    return data_file("en_jfk_inaugural/jfk.mp3").read_bytes()[:n]


BAD = {
    "text file": (lambda: b"this is a text file, not a recording\n" * 20, "notes.txt", "decode_failed"),
    "empty file": (lambda: b"", "empty.wav", "empty_audio"),
    "mp3 cut inside its header": (lambda: mp3_head(400), "cut.mp3", "decode_failed"),
    "video without audio": (video_without_audio, "silent.mp4", "no_audio_stream"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_upload_is_422_with_code_and_service_keeps_serving(client, case):
    make, name, code = BAD[case]
    r = client.post("/v1/jobs", files={"file": (name, make())})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    assert "/tmp" not in err["message"]  # no server paths leak
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text


@pytest.mark.parametrize("case", list(BAD))
def test_the_api_refuses_a_bad_file_in_the_decoders_words(client, tmp_path, case):
    """One wording per bad file: the API's intake says what the decoder (the CLI, the engine server) says."""
    from transcription.audio import AudioError, decode_audio

    make, name, _ = BAD[case]
    (tmp_path / "upload").write_bytes(make())  # no suffix, as the intake spools it (FFmpeg reads *.txt as tty)
    with pytest.raises(AudioError) as e:
        decode_audio(tmp_path / "upload")
    r = client.post("/v1/jobs", files={"file": (name, make())})
    assert r.json()["error"] == {"code": e.value.code, "message": e.value.message}


def test_bad_input_leaves_no_job_behind(client):
    before = client.get("/v1/jobs", params={"limit": 200}).json()["data"]
    client.post("/v1/jobs", files={"file": ("x.txt", b"not audio")})
    after = client.get("/v1/jobs", params={"limit": 200}).json()["data"]
    assert len(after) == len(before)


def test_missing_file_field_and_wrong_content_type(client):
    r = client.post("/v1/jobs", files={"other": ("a.wav", b"x")})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    r = client.post("/v1/jobs", content=b"raw", headers={"content-type": "audio/wav"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


def test_invalid_options_are_422(client):
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"min_speakers": "3", "max_speakers": "2"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    assert "min_speakers" in r.json()["error"]["message"] and "Value error" not in r.json()["error"]["message"]
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"num_speakers": "3", "max_speakers": "2"})
    assert r.status_code == 422 and "num_speakers must lie between" in r.json()["error"]["message"]
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"num_speakers": "zero"})
    assert r.status_code == 422 and "num_speakers" in r.json()["error"]["message"]


def test_language_is_an_iso_code_the_model_transcribes(client, app_with):
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"language": "zh"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_language", r.text
    assert "'zh'" in r.json()["error"]["message"]
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"language": "klingon"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    assert r.json()["error"]["message"].startswith("language: language must be an ISO 639-1 code")
    r = client.post("/v1/audio/transcriptions", files={"file": ("y.wav", wav)},
                    data={"model": "whisper-1", "language": "de"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_language"
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"language": " EN "})
    assert r.status_code == 202 and r.json()["options"]["language"] == "en"
    multilingual = app_with(languages=[])  # a multilingual model's server takes any code
    r = multilingual.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"language": "zh"})
    assert r.status_code == 202, r.text
    from diarist.settings import Settings  # unset, the default follows the model family

    assert Settings(_env_file=None, model="moss-td").accepted_languages == []
    assert Settings(_env_file=None).accepted_languages == ["en"]
    assert Settings(_env_file=None, languages=["en", "de"]).accepted_languages == ["en", "de"]


def test_unknown_model_is_422(client):
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"model": "whisper-large-v9"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_model"


def test_unknown_job_is_404_json(client):
    r = client.get("/v1/jobs/job_doesnotexist")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert client.delete("/v1/jobs/job_doesnotexist").status_code == 404
    assert client.get("/v1/nothing-here").json()["error"]["code"] == "not_found"


def test_limits(app_with):
    wav = data_file("en_jfk_inaugural/jfk.flac").read_bytes()  # 11 s, ~1 MB
    small = app_with(max_upload_bytes=10_000)
    r = small.post("/v1/jobs", files={"file": ("jfk.flac", wav)})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    short_limit = app_with(max_duration_s=5.0)
    r = short_limit.post("/v1/jobs", files={"file": ("jfk.flac", wav)})
    assert r.status_code == 422 and r.json()["error"]["code"] == "too_long"
    assert "11.0 s" in r.json()["error"]["message"]
    high_min = app_with(min_duration_s=20.0)
    r = high_min.post("/v1/jobs", files={"file": ("jfk.flac", wav)})
    assert r.status_code == 422 and r.json()["error"]["code"] == "too_short"
    openai_min = app_with(min_duration_s=0.1)  # an mp3 cut after 40 ms of audio
    r = openai_min.post("/v1/jobs", files={"file": ("short.mp3", mp3_head(1000))})
    assert r.status_code == 422 and r.json()["error"]["code"] == "too_short"


@pytest.mark.parametrize("clip", ["30ms", "3_samples"])
def test_a_clip_shorter_than_the_documented_minimum_is_too_short(client, clip):
    """A clip too short to hold a phoneme is refused at submit (``transcription.limits.MIN_DURATION_S``),
    not accepted as a job that completes with an empty transcript; nothing is stored."""
    audio = (data_file("en_short_yes/yes_30ms.wav").read_bytes() if clip == "30ms"
             else pcm16_wav(np.full(3, 1000, np.int16)))
    before = len(client.get("/v1/jobs").json()["data"])
    r = client.post("/v1/jobs", files={"file": ("short.wav", audio)})
    assert r.status_code == 422 and r.json()["error"]["code"] == "too_short", r.text
    assert f"minimum is {MIN_DURATION_S:g} s" in r.json()["error"]["message"]
    assert len(client.get("/v1/jobs").json()["data"]) == before  # no job was created


def test_webhook_url_to_private_address_is_refused_without_allow_list(app_with):
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    c = app_with(webhook_allow_hosts=[])
    for url, code in [("http://127.0.0.1:9/hook", "url_not_allowed"), ("http://10.1.2.3/x", "url_not_allowed"),
                      ("http://[::1]/x", "url_not_allowed"), ("ftp://example.com/x", "invalid_url")]:
        r = c.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"webhook_url": url})
        assert r.status_code == 422 and r.json()["error"]["code"] == code, (url, r.text)


def test_audio_url_to_private_address_is_refused_without_allow_list(app_with):
    c = app_with(audio_url_allow_hosts=[])
    r = c.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/a.wav"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "url_not_allowed"


def test_oversized_json_request_is_413(client):
    r = client.post("/v1/jobs", content=b'{"audio_url": "' + b"a" * (70 << 10) + b'"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"



def test_an_abandoned_upload_is_one_log_line_not_a_traceback(tmp_path, caplog):
    """Issue 33 item 25: the client sends part of a multipart upload and disconnects: one INFO line, no
    traceback, no job (the real POST /v1/jobs, driven as the ASGI server would)."""
    import asyncio
    import logging

    from tests.api.test_readyz import app_for

    svc, app = app_for(tmp_path)
    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            "Content-Type: audio/wav\r\n\r\n").encode() + b"RIFF" + b"\0" * 4096
    events = [{"type": "http.request", "body": head, "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict] = []
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/jobs", "raw_path": b"/v1/jobs", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"testserver"), (b"content-type", f"multipart/form-data; boundary={boundary}".encode()),
                         (b"content-length", b"10000000")]}

    async def receive() -> dict:
        return events.pop(0) if events else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    caplog.set_level(logging.INFO)
    try:
        asyncio.run(app(scope, receive, send))
        with svc.db.session() as s:
            from diarist.models import Job

            assert s.query(Job).count() == 0
    finally:
        svc.close()
    mine = [r for r in caplog.records if "/v1/jobs" in r.getMessage()]
    assert [r.getMessage() for r in mine] == [
        "POST /v1/jobs: the client closed the connection before its request was read (upload abandoned)"]
    assert not any(r.exc_info for r in caplog.records)
