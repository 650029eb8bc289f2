"""verbose_json's per-segment scores come from the Whisper window that wrote each segment
(``diarist/decode_windows.py``); without windows (MOSS-TD) they stay null, never invented."""

from __future__ import annotations

import json

from diarist.decode_windows import DecodeWindow, read_windows, window_of
from diarist.formats import to_verbose_json
from diarist.transcript import Transcript


def result(windows):
    return {"duration": 60.0, "model": "tiny.en", "finish_reason": "stop", "metrics": {}, "windows": windows,
            "segments": [{"speaker": 0, "start": 1.0, "end": 4.0, "text": "first window"},
                         {"speaker": 1, "start": 27.5, "end": 31.0, "text": "mostly the second"},
                         {"speaker": 0, "start": 40.0, "end": 44.0, "text": "second window"}]}


WINDOWS = [  # as transcription.whisper.window_decoder's WindowResult.as_dict writes them
    {"start": 0.0, "end": 28.0, "status": "ok", "flag": None, "attempts": 1, "temperature": 0.0,
     "compression_ratio": 1.41, "avg_logprob": -0.2312, "no_speech_prob": 0.0132, "vad_confidence": 0.91},
    {"start": 28.0, "end": 58.0, "status": "ok", "flag": None, "attempts": 2, "temperature": 0.2,
     "compression_ratio": 1.9, "avg_logprob": -0.5, "no_speech_prob": None, "vad_confidence": None},
]


def scores(body: str) -> list[tuple]:
    return [(s["temperature"], s["avg_logprob"], s["compression_ratio"], s["no_speech_prob"])
            for s in json.loads(body)["segments"]]


def test_each_segment_gets_the_scores_of_the_window_it_lies_in_most():
    t = Transcript.from_engine_json(result(WINDOWS))
    assert scores(to_verbose_json(t)) == [(0.0, -0.2312, 1.41, 0.0132), (0.2, -0.5, 1.9, None),
                                          (0.2, -0.5, 1.9, None)]
    assert Transcript.model_validate_json(t.model_dump_json()) == t  # stored and read back, as the API does


def test_a_segment_with_every_score_is_a_valid_openai_segment():
    """The openai client's own model of a verbose_json segment requires the four scores as numbers."""
    from openai.types.audio import TranscriptionSegment

    first = json.loads(to_verbose_json(Transcript.from_engine_json(result(WINDOWS))))["segments"][0]
    seg = TranscriptionSegment.model_validate(first)
    assert (seg.avg_logprob, seg.no_speech_prob, seg.compression_ratio, seg.temperature) == (-0.2312, 0.0132,
                                                                                           1.41, 0.0)


def test_without_windows_the_scores_stay_null():
    t = Transcript.from_engine_json(result(None))
    assert t.windows is None
    assert scores(to_verbose_json(t)) == [(0.0, None, None, None)] * 3


def test_windows_are_read_leniently():
    got = read_windows([{"start": "x", "end": 3}, {"start": -1, "end": 99.0, "avg_logprob": float("nan"),
                                                   "no_speech_prob": 1.5, "channel": 1}], duration=60.0)
    assert got == [DecodeWindow(start=0.0, end=60.0, channel=1)]
    assert window_of(got, 10.0, 12.0) is None  # channel 0's segment: not this window's
    assert window_of(got, 10.0, 10.0, channel=1) == got[0]  # zero length: the window containing it
