"""The upload's duration comes from the container header, not a full decode (issue 33 item 24): a 3-hour
MP3 held its POST for 83 s while every frame was decoded. Only the first ``PROBE_DECODE_S`` seconds are
decoded (an undecodable stream is still refused at once), unless the header puts the file near the
duration limit, where the whole file is decoded so that ``too_long`` is exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from api import intake

SECONDS = 60


@pytest.fixture(scope="module")
def mp3(tmp_path_factory) -> Path:
    """``SECONDS`` of 16 kHz mono noise as MP3 (LAME writes the Info header that gives its duration)."""
    import av

    path = tmp_path_factory.mktemp("probe") / "noise.mp3"
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libmp3lame", rate=16_000, layout="mono")
        for _ in range(SECONDS * 16_000 // 1152):
            frame = av.AudioFrame.from_ndarray((0.1 * rng.standard_normal((1, 1152))).astype(np.float32),
                                               format="fltp", layout="mono")
            frame.sample_rate = 16_000
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


@pytest.fixture
def decoded(monkeypatch) -> list[int]:
    """Counts the samples the intake decodes (the frames of its ``decoded_frames``, wrapped)."""
    counted: list[int] = [0]
    real = intake.decoded_frames

    def counting(container, stream, damage):
        for frame in real(container, stream, damage):
            counted[0] += frame.samples
            yield frame

    monkeypatch.setattr(intake, "decoded_frames", counting)
    return counted


def test_a_long_file_is_measured_from_its_header_with_a_bounded_decode(mp3, decoded):
    duration = intake.measure_duration(mp3, limit_s=6 * 3600.0)
    assert duration == pytest.approx(SECONDS, abs=0.2)
    assert decoded[0] / 16_000 <= intake.PROBE_DECODE_S + 0.1  # not the whole minute


def test_near_the_limit_the_whole_file_is_decoded_and_too_long_is_exact(mp3, decoded):
    limit = SECONDS * 0.95  # within HEADER_MARGIN of the header's duration
    duration = intake.measure_duration(mp3, limit_s=limit)
    assert decoded[0] / 16_000 == pytest.approx(duration, abs=0.01)
    assert duration == pytest.approx(SECONDS, abs=0.2) and duration > limit
    decoded[0] = 0
    assert intake.measure_duration(mp3, limit_s=SECONDS * 1.05) == pytest.approx(duration, abs=0.01)
    assert decoded[0] / 16_000 == pytest.approx(duration, abs=0.01)


def test_a_file_cut_short_is_measured_by_decoding_not_by_its_header(mp3, tmp_path, decoded):
    """The header of a cut file still states the whole duration; the bytes are not there for it."""
    cut = tmp_path / "cut.mp3"
    cut.write_bytes(mp3.read_bytes()[: len(mp3.read_bytes()) // 4])
    duration = intake.measure_duration(cut, limit_s=6 * 3600.0)
    assert duration == pytest.approx(decoded[0] / 16_000, abs=0.01) and duration < SECONDS / 3
