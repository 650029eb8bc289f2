"""Known speakers without a model: matching rules, the voice vectors on the wire, identities in every export."""

from __future__ import annotations

import numpy as np
import pytest

from diarist.contract.errors import ProtocolError
from diarist.contract.result import SpeakerEmbedding, TranscriptionResult
from diarist.formats import SUPPORTED_FORMATS, render
from diarist.speakers import ProfileVoice, match, profile_vector, scores
from diarist.transcript import SpeakerIdentity, Transcript

MODEL = "campplus@test"


def unit(*x: float) -> np.ndarray:
    v = np.asarray(x, np.float32)
    return v / np.linalg.norm(v)


def voice(speaker, *x: float, model: str = MODEL) -> SpeakerEmbedding:
    return SpeakerEmbedding(speaker, [float(a) for a in unit(*x)], model, 5.0)


def profile(pid: str, *x: float, model: str = MODEL) -> ProfileVoice:
    return ProfileVoice(pid, pid.upper(), model, unit(*x))


def test_each_voice_takes_its_best_profile_above_the_threshold():
    got = match([voice(0, 1, 0.1, 0), voice(1, 0, 1, 0.1)], [profile("b", 0, 1, 0), profile("a", 1, 0, 0)], 0.5)
    assert {i: m.profile_id for i, m in got.items()} == {0: "a", 1: "b"}
    assert got[0].name == "A" and got[0].score == pytest.approx(float(unit(1, 0.1, 0)[0]), abs=1e-4)


def test_an_unknown_voice_is_never_forced_onto_a_profile():
    # the closest profile scores 0.2: below the threshold the voice stays unnamed
    assert match([voice(0, 0.2, 0.98, 0)], [profile("a", 1, 0, 0)], 0.5) == {}
    assert match([], [profile("a", 1, 0, 0)], 0.5) == {} and match([voice(0, 1, 0)], [], 0.5) == {}


def test_two_speakers_never_get_the_same_profile():
    # both voices are closest to "a"; one-to-one: the closer one gets it, the other takes "b" if above
    # the threshold, else nothing
    voices = [voice(0, 1, 0.05, 0), voice(1, 1, 0.3, 0)]
    got = match(voices, [profile("a", 1, 0, 0)], 0.5)
    assert list(got) == [0]
    got = match(voices, [profile("a", 1, 0, 0), profile("b", 1, 0.5, 0)], 0.5)
    assert {i: m.profile_id for i, m in got.items()} == {0: "a", 1: "b"}


def test_the_assignment_maximises_the_matched_pairs_not_one_greedy_pick():
    # greedy would give voice 0 to "a" (its best pair, 0.995) and leave voice 1 (close to "a" only) unnamed
    sim_a, sim_b = unit(1, 0, 0), unit(0.6, 0.8, 0)
    v0 = SpeakerEmbedding(0, list(map(float, unit(1, 0.1, 0))), MODEL, 5.0)
    v1 = SpeakerEmbedding(1, list(map(float, unit(1, -0.6, 0))), MODEL, 5.0)
    profiles = [ProfileVoice("a", "A", MODEL, sim_a), ProfileVoice("b", "B", MODEL, sim_b)]
    s = scores([v0, v1], profiles)
    assert s[0, 0] > s[1, 0] > 0.5 and s[0, 1] > 0.5 > s[1, 1]
    got = match([v0, v1], profiles, 0.5)
    assert {i: m.profile_id for i, m in got.items()} == {0: "b", 1: "a"}


def test_a_profile_of_another_embedding_model_never_scores():
    assert scores([voice(0, 1, 0)], [profile("a", 1, 0, model="ge2e@1")])[0, 0] == -np.inf
    assert match([voice(0, 1, 0)], [profile("a", 1, 0, model="ge2e@1")], -1.0) == {}


def test_profile_vector_is_the_speech_weighted_unit_mean():
    v = profile_vector([[1, 0], [0, 1]], [3.0, 1.0])
    assert np.allclose(v, unit(3, 1)) and v.dtype == np.float32
    with pytest.raises(ValueError):
        profile_vector([], [])


def _result(**extra) -> dict:
    return {"duration": 10.0, "finish_reason": "stop", "metrics": {}, "model": "m",
            "segments": [{"start": 0.0, "end": 4.0, "text": "Hello there.", "speaker": 7},
                         {"start": 5.0, "end": 9.0, "text": "Hi.", "speaker": 3}], **extra}


def test_voice_vectors_cross_the_wire_and_old_results_still_read():
    raw = _result(speaker_embeddings=[voice(7, 1, 0).to_json(), voice(3, 0, 1).to_json()])
    r = TranscriptionResult.from_json(raw)
    assert [v.speaker for v in r.speaker_embeddings] == [7, 3]
    assert TranscriptionResult.from_json(r.to_json()) == r
    assert TranscriptionResult.from_json(_result()).speaker_embeddings is None
    for bad in ([{"speaker": 1, "vector": [], "model": MODEL, "speech_s": 1.0}],
                [{"speaker": 1, "vector": [1.0, "x"], "model": MODEL, "speech_s": 1.0}],
                [{"speaker": 1, "vector": [1.0], "speech_s": 1.0}], "not a list"):
        with pytest.raises(ProtocolError):
            TranscriptionResult.from_json(_result(speaker_embeddings=bad))


def test_voices_follow_the_transcripts_relabelling_and_are_never_serialised():
    raw = _result(speaker_embeddings=[voice(7, 1, 0).to_json(), voice(3, 0, 1).to_json(),
                                      voice(99, 1, 1).to_json()])
    t = Transcript.from_engine_json(raw)
    assert t.speakers == ["S01", "S02"]
    assert t.voices["S01"].speaker == 7 and t.voices["S02"].speaker == 3 and len(t.voices) == 2
    assert "vector" not in t.model_dump_json() and "voices" not in t.model_dump()


def test_every_export_shows_the_names():
    t = Transcript.from_engine_json(_result(turns=[{"speaker": 7, "start": 0.0, "end": 4.0},
                                                   {"speaker": 3, "start": 5.0, "end": 9.0}]))
    t.identities = {"S01": SpeakerIdentity(name="Alice Chen", profile_id="spk_a", match_score=0.71),
                    "S02": SpeakerIdentity()}
    shown = {"json": '"name": "Alice Chen"', "txt": "Alice Chen: Hello", "srt": "Alice Chen: Hello",
             "vtt": "<v Alice Chen>Hello", "rttm": " Alice_Chen ", "verbose_json": '"speaker": "Alice Chen"',
             "diarized_json": '"speaker": "Alice Chen"', "svg": ">Alice Chen<"}
    for fmt in SUPPORTED_FORMATS:
        body, _ = render(t, fmt)
        if fmt != "text":
            assert shown[fmt] in body, (fmt, body)
            assert "S02" in body  # an unknown voice keeps its label
    t2 = Transcript.model_validate_json(t.model_dump_json())
    assert t2.identities == t.identities and t2.display("S01") == "Alice Chen" and t2.display("S02") == "S02"
