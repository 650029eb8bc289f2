"""A real result of the tiny.en CPU engine crosses the engine server's wire unchanged (typed both sides)."""

from __future__ import annotations

import json

from diarist.contract.events import ResultLine, from_line, to_line
from diarist.contract.result import TranscriptionResult
from diarist.transcript import Transcript
from tests.conftest import data_file
from transcription.transcriber import TranscribeOptions, Transcriber


def test_a_tiny_en_result_round_trips_through_the_result_line(whisper_engine):
    r = Transcriber(whisper_engine).transcribe(data_file("en_jfk_inaugural/jfk.flac"), TranscribeOptions(num_speakers=1))
    assert isinstance(r, TranscriptionResult) and r.segments and r.segments[0].words  # words: the richest shape
    assert r.windows and r.turns and r.metrics.output_tokens > 0 and "vad_s" in r.pipeline_metrics
    line = to_line(ResultLine(r))
    back = from_line(line).result
    assert back == r
    wire = json.loads(line)["result"]
    assert TranscriptionResult.from_json(wire).to_json() == wire  # the JSON form is a fixed point
    assert Transcript.from_engine(back) == Transcript.from_engine(r)
