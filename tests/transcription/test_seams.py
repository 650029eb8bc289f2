"""Window seams on real and synthetic speech: where one 30 s window ends inside speech and the next begins,
no word is lost and none is decoded twice.

Two recordings whose speech runs through the 30 s cut: espeak-ng reading a long unpunctuated text (no pause
a VAD could cut at), and shared clips played back to back, decoded as one speech region (as when the VAD
finds no pause longer than 0.3 s). Before the seam rule, the back-to-back case lost "and so my fellow
Americans" (5 words) at the cut.
"""

from __future__ import annotations

import io
import itertools
import re
import shutil
import subprocess

import numpy as np
import pytest

from diarist.contract.result import TranscriptionResult
from tests.conftest import data_file
from transcription.audio import SAMPLE_RATE, decode_audio
from transcription.transcriber import TranscribeOptions, Transcriber

jiwer = pytest.importorskip("jiwer")
soundfile = pytest.importorskip("soundfile")

TEXT = ("the quick brown fox jumps over the lazy dog and then it runs across the green field toward the old barn "
        "where the farmer keeps his tools and the children play every afternoon after school while their parents "
        "work in the garden planting tomatoes and beans and carrots for the long winter ahead when the snow covers "
        "the hills and the river freezes so that nobody can fish until the spring returns with warm rain and bright "
        "flowers that bloom along the road leading to the village market where people sell bread cheese honey and "
        "fresh milk from the cows that graze on the meadow beyond the forest")


def norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


def wav_bytes(wave: np.ndarray) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, wave, SAMPLE_RATE, format="WAV")
    return buf.getvalue()


@pytest.fixture(scope="module")
def tr(whisper_engine):
    return Transcriber(whisper_engine)


def assert_seams_whole(result: TranscriptionResult, reference: str) -> None:
    """Every seam between two windows of one speech run joins consecutive reference words: the last word
    before it and the first after it align (equal or substituted) to reference words ``j`` and ``j + 1``."""
    windows = result.windows
    seams = [a["end"] for a, b in itertools.pairwise(windows) if abs(a["end"] - b["start"]) < 1e-3]
    assert seams, f"no window was cut inside speech: {windows}"
    assert windows[0]["end"] < 30.0  # the cut window kept only what ends before the cut
    hyp_words, before = [], []
    for s in result.segments:
        ws = norm(s.text).split()
        hyp_words += ws
        before.append((s.end, len(hyp_words)))
    out = jiwer.process_words(norm(reference), " ".join(hyp_words))
    ref_of = {}
    for c in out.alignments[0]:
        if c.type in ("equal", "substitute"):
            for k in range(c.hyp_end_idx - c.hyp_start_idx):
                ref_of[c.hyp_start_idx + k] = c.ref_start_idx + k
    for seam in seams:
        n = max(count for end, count in before if end <= seam + 1e-3)  # hyp words that end by the seam
        assert n - 1 in ref_of and n in ref_of, f"a word at the seam {seam:.2f} s is not in the reference"
        assert ref_of[n] == ref_of[n - 1] + 1, (f"seam at {seam:.2f} s: reference words "
                                                f"{ref_of[n - 1]} then {ref_of[n]}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (Debian espeak-ng)")
def test_synthetic_speech_without_a_pause_across_the_cut(tr, tmp_path):
    path = tmp_path / "long.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), TEXT], check=True)
    r = tr.transcribe(path, TranscribeOptions(diarize=False))
    assert r.duration > 32.0 and r.pipeline_metrics["windows_refed"] >= 1
    assert_seams_whole(r, TEXT)
    out = jiwer.process_words(norm(TEXT), norm(" ".join(s.text for s in r.segments)))
    assert out.insertions == 0 and out.deletions <= 4  # tiny.en on espeak: a few merged words elsewhere
    assert not r.incomplete


@pytest.mark.slow
def test_back_to_back_clips_decoded_as_one_speech_run(tr, monkeypatch):
    names = {"lib": "en_librispeech_1995-1837-0001/librispeech-1995-1837-0001",
             "tst": "en_librispeech_1272-128104-0000_picovoice/test", "jfk": "en_jfk_inaugural/jfk"}
    ext = {"lib": ".wav", "tst": ".wav", "jfk": ".flac"}

    def trimmed(key: str) -> np.ndarray:
        w = decode_audio(data_file(names[key] + ext[key])).mono
        loud = np.flatnonzero(np.abs(w) > 0.01)
        return w[loud[0] : loud[-1] + 1]

    order = ["lib", "tst", "lib", "tst", "jfk"]  # 38 s; the cut at 30 s falls in "and so my fellow Americans"
    wave = np.concatenate([trimmed(k) for k in order]).astype(np.float32)
    reference = " ".join(data_file(names[k] + ".txt").read_text() for k in order)
    duration = len(wave) / SAMPLE_RATE
    # one run, no pause to cut at: the Whisper pipeline's VAD answers the whole clip
    monkeypatch.setattr(tr.pipeline, "_speech", lambda w, should_cancel=None: ([(0.0, duration)], None))
    r = tr.transcribe(wav_bytes(wave), TranscribeOptions(diarize=False))
    assert_seams_whole(r, reference)
    hyp = norm(" ".join(s.text for s in r.segments))
    assert hyp.count("and so my fellow americans ask not") == 1
    out = jiwer.process_words(norm(reference), hyp)
    assert out.insertions == 0 and out.deletions <= 2  # "we are" -> "we're", twice
