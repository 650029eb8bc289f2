"""The service's side of languages: which languages and tasks a server takes follows the model it serves
(settings), and a request the model cannot honour is refused with a code before any job exists."""

from __future__ import annotations

from diarist.settings import Settings
from engine.checkpoints import WHISPER_LANGUAGES
from tests.conftest import data_file


def test_defaults_follow_the_served_checkpoint():
    tiny = Settings(_env_file=None)
    assert tiny.accepted_languages == ["en"] and not tiny.can_translate
    assert tiny.served_model_names == ["whisper", "whisper-1", "tiny.en"]
    base = Settings(_env_file=None, model_path="base")
    assert base.accepted_languages == list(WHISPER_LANGUAGES) and base.can_translate
    assert base.served_model_names == ["whisper", "whisper-1", "base"]
    a_dir = Settings(_env_file=None, model_path="/models/whisper-small")  # unknown: English unless told
    assert a_dir.accepted_languages == ["en"] and a_dir.served_model_names == ["whisper", "whisper-1"]
    assert Settings(_env_file=None, model_path="/models/x", languages=[]).can_translate
    moss = Settings(_env_file=None, model="moss-td")
    assert not moss.can_translate and moss.served_model_names == ["whisper", "whisper-1", "moss-td"]
    assert Settings(_env_file=None, served_models=["x"]).served_model_names == ["x"]


def test_translate_needs_a_multilingual_model(client, app_with):
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"task": "translate"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_task", r.text
    r = client.post("/v1/audio/translations", files={"file": ("y.wav", wav)}, data={"model": "whisper-1"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_task", r.text
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"task": "summarize"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    base = app_with(model_path="base")
    r = base.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"task": "translate", "language": "ja"})
    assert r.status_code == 202, r.text
    assert r.json()["options"]["task"] == "translate" and r.json()["options"]["language"] == "ja"
    r = base.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"language": "xx"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_language"
    r = base.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"model": "tiny.en"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_model"


def test_task_reaches_the_engine_over_the_wire():
    """The worker sends OPTION_FIELDS in the options header; the engine server reads them back into
    TranscribeOptions (engine_server.protocol), so task arrives (and a field outside it does not)."""
    from diarist.contract.options import OPTION_FIELDS, TranscribeOptions
    from diarist.pcm import PcmFormat
    from engine_server.protocol import read_request, request_headers

    assert "task" in OPTION_FIELDS and "language" in OPTION_FIELDS
    fmt = PcmFormat(channels=1, frames=16, sample_rate=16_000, source_sample_rate=16_000, source_channels=1)
    sent = TranscribeOptions.from_json({"task": "translate", "language": "ja", "webhook_url": "http://x"})
    opts = read_request(request_headers(sent, fmt), ("default",)).options
    assert (opts.task, opts.language) == ("translate", "ja") and not hasattr(opts, "webhook_url")
    assert TranscribeOptions.from_json({}).task == "transcribe"


def test_translations_route_is_in_the_schema(client):
    spec = client.get("/openapi.json").json()
    form = spec["paths"]["/v1/audio/translations"]["post"]
    assert "422" in form["responses"]
    jobs = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert "task" in str(jobs) or "task" in str(spec["components"])
