"""``POST /v1/audio/transcriptions`` driven by the official ``openai`` Python client."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import data_file

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def oai(stack):
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused-auth-off", max_retries=0, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def jfk():
    return data_file("en_jfk_inaugural/jfk.flac")


def test_json_and_text(oai, jfk):
    with jfk.open("rb") as f:
        r = oai.audio.transcriptions.create(model="whisper-1", file=f)
    assert "ask not what your country can do for you" in r.text.lower()
    with jfk.open("rb") as f:
        text = oai.audio.transcriptions.create(model="whisper-1", file=f, response_format="text")
    assert isinstance(text, str) and "ask not" in text.lower()


@pytest.mark.parametrize(("fmt", "check"), [
    ("srt", lambda body: "00:00:0" in body and "-->" in body),
    ("vtt", lambda body: body.startswith("WEBVTT")),
    ("verbose_json", lambda body: json.loads(body)["segments"][0]["start"] >= 0),
    ("diarized_json", lambda body: json.loads(body)["segments"][0]["speaker"] == "S01"),
])
def test_other_response_formats(oai, jfk, fmt, check):
    with jfk.open("rb") as f:
        raw = oai.audio.transcriptions.with_raw_response.create(model="whisper-1", file=f, response_format=fmt)
    assert raw.http_response.status_code == 200
    assert check(raw.http_response.text)


def test_stream_events(oai, jfk):
    with jfk.open("rb") as f:
        stream = oai.audio.transcriptions.create(model="whisper-1", file=f, stream=True,
                                                 response_format="diarized_json")
        events = list(stream)
    types = [e.type for e in events]
    assert types[-1] == "transcript.text.done" and "transcript.text.delta" in types
    assert "transcript.text.segment" in types
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    done = events[-1].text
    assert "ask not" in done.lower()
    assert " ".join(deltas.split()) == " ".join(done.split())
    seg = next(e for e in events if e.type == "transcript.text.segment")
    assert seg.speaker == "S01" and 0 <= seg.start <= seg.end <= 11.0


def test_errors_use_the_openai_error_shape(oai):
    with pytest.raises(openai.UnprocessableEntityError) as e:
        oai.audio.transcriptions.create(model="whisper-1", file=("notes.txt", b"not audio"))
    assert e.value.body["code"] == "decode_failed"
    with pytest.raises(openai.UnprocessableEntityError) as e:
        oai.audio.transcriptions.create(model="gpt-9-transcribe", file=data_file("en_jfk_inaugural/jfk.flac"))
    assert e.value.body["code"] == "unknown_model"


def test_completeness_fields_in_json_shapes_and_the_final_event(oai, jfk):
    for fmt in ("json", "verbose_json", "diarized_json"):
        with jfk.open("rb") as f:
            raw = oai.audio.transcriptions.with_raw_response.create(model="whisper-1", file=f, response_format=fmt)
        body = json.loads(raw.http_response.text)
        assert body["finish_reason"] == "stop" and body["incomplete"] is False and body["incomplete_reason"] is None
        assert 0.85 <= body["coverage"] <= 1.0 and body["warnings"] == [], fmt  # JFK is transcribed whole
        assert raw.http_response.headers["x-diarist-incomplete"] == "false"
        assert float(raw.http_response.headers["x-diarist-coverage"]) == pytest.approx(body["coverage"], abs=1e-4)
    with jfk.open("rb") as f:
        raw = oai.audio.transcriptions.with_raw_response.create(model="whisper-1", file=f, response_format="srt")
    assert raw.http_response.headers["x-diarist-finish-reason"] == "stop"
    with jfk.open("rb") as f:
        events = list(oai.audio.transcriptions.create(model="whisper-1", file=f, stream=True))
    done = events[-1].model_dump()
    assert done["type"] == "transcript.text.done" and done["finish_reason"] == "stop"
    assert done["incomplete"] is False and 0.85 <= done["coverage"] <= 1.0


def test_nan_samples_are_reported_or_refused(oai, tmp_path):
    from tests.transcription.test_bad_samples import BAD, SPEECH, float_wav, with_bad
    from transcription.audio import decode_audio

    clean = decode_audio(data_file(SPEECH)).samples[0]
    few = float_wav(tmp_path / "few.wav", with_bad(clean, BAD))
    with few.open("rb") as f:
        raw = oai.audio.transcriptions.with_raw_response.create(model="whisper-1", file=f,
                                                                response_format="verbose_json")
    body = json.loads(raw.http_response.text)
    assert "quilter" in body["text"].lower()
    assert [(w["code"], w["count"]) for w in body["warnings"]] == [("invalid_samples", len(BAD))]
    many = float_wav(tmp_path / "many.wav", with_bad(clean, dict.fromkeys(range(0, clean.size, 20), float("nan"))))
    with pytest.raises(openai.UnprocessableEntityError) as e, many.open("rb") as f:
        oai.audio.transcriptions.create(model="whisper-1", file=f)
    assert e.value.body["code"] == "invalid_samples"


def test_verbose_json_segments_carry_their_windows_scores(oai, jfk):
    """Each segment's avg_logprob / compression_ratio / temperature / no_speech_prob are its Whisper
    window's (diarist/decode_windows.py), not nulls."""
    from transcription.decode_quality import TEMPERATURES

    with jfk.open("rb") as f:
        raw = oai.audio.transcriptions.with_raw_response.create(model="whisper-1", file=f,
                                                                response_format="verbose_json")
    segments = json.loads(raw.http_response.text)["segments"]
    assert segments
    for s in segments:
        assert isinstance(s["avg_logprob"], float) and s["avg_logprob"] < 0
        assert s["compression_ratio"] > 0 and s["temperature"] in TEMPERATURES
        assert s["no_speech_prob"] is None or 0.0 <= s["no_speech_prob"] <= 1.0


def test_timestamp_granularities_are_honoured_or_refused(oai, jfk):
    """``timestamp_granularities[]`` as the official client sends it (issue 33 item 20)."""
    def verbose(**kw):
        with jfk.open("rb") as f:
            raw = oai.audio.transcriptions.with_raw_response.create(model="whisper-1", file=f,
                                                                    response_format="verbose_json", **kw)
        return json.loads(raw.http_response.text)

    words = verbose(timestamp_granularities=["word"])
    assert "segments" not in words and any(w["word"].strip(" ,.").lower() == "country" for w in words["words"])
    assert all(0 <= w["start"] <= w["end"] <= 11.5 for w in words["words"])
    segments = verbose(timestamp_granularities=["segment"])
    assert "words" not in segments and segments["segments"][0]["start"] >= 0
    both = verbose(timestamp_granularities=["word", "segment"])
    assert both["words"] and both["segments"]
    with pytest.raises(openai.UnprocessableEntityError) as e, jfk.open("rb") as f:
        oai.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                        timestamp_granularities=["character"])
    assert e.value.body["code"] == "invalid_request" and "character" in e.value.body["message"]
    with pytest.raises(openai.UnprocessableEntityError) as e, jfk.open("rb") as f:
        oai.audio.transcriptions.create(model="whisper-1", file=f, response_format="json",
                                        timestamp_granularities=["word"])
    assert e.value.body["code"] == "invalid_request" and "verbose_json" in e.value.body["message"]


def test_temperature_is_the_first_decoding_temperature(oai, jfk):
    """``temperature`` is honoured (issue 33 item 7): every window's first attempt samples at it (seeded), so
    each segment's window temperature is on the ladder that starts there; out of range is a 422."""
    from transcription.decode_quality import temperature_schedule

    runs = []
    for _ in range(2):
        with jfk.open("rb") as f:
            raw = oai.audio.transcriptions.with_raw_response.create(model="whisper-1", file=f, temperature=0.4,
                                                                    response_format="verbose_json")
        runs.append(json.loads(raw.http_response.text))
    assert runs[0]["segments"] and all(s["temperature"] in temperature_schedule(0.4) for s in runs[0]["segments"])
    assert runs[0]["text"] == runs[1]["text"]  # seeded: the same file gives the same transcript
    with pytest.raises(openai.UnprocessableEntityError) as e, jfk.open("rb") as f:
        oai.audio.transcriptions.create(model="whisper-1", file=f, temperature=1.5)
    assert e.value.body["code"] == "invalid_request"
