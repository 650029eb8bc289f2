"""Whisper's log-mel features (n_fft 400, hop 160, 80 Slaney mel bins, 30 s windows).

Formula (OpenAI whisper ``audio.py::log_mel_spectrogram``; HF ``WhisperFeatureExtractor``): zero-pad the
window to 480,000 samples, centred STFT with a periodic Hann window (reflect padding), drop the last frame,
power spectrum, Slaney mel filters (``torchaudio.functional.melscale_fbanks`` with ``norm="slaney"``,
``mel_scale="slaney"``, equal to librosa's), ``log10(max(x, 1e-10))``, clamp to ``max - 8``, then
``(x + 4) / 4``.
"""

from __future__ import annotations

import functools

import torch
import torchaudio

from engine.models.audio_input import SAMPLE_RATE

N_FFT = 400
HOP_LENGTH = 160
CHUNK_SAMPLES = 480_000
N_FRAMES = 3000


@functools.lru_cache(maxsize=8)
def _filters(n_mels: int, device: str) -> torch.Tensor:
    fb = torchaudio.functional.melscale_fbanks(
        n_freqs=N_FFT // 2 + 1, f_min=0.0, f_max=SAMPLE_RATE / 2, n_mels=n_mels, sample_rate=SAMPLE_RATE,
        norm="slaney", mel_scale="slaney")
    return fb.T.contiguous().to(device)  # [n_mels, n_freqs]


def log_mel_spectrogram(windows: torch.Tensor, n_mels: int = 80) -> torch.Tensor:
    """Log-mel features of 30 s windows.

    Args:
        windows: float32 ``[B, n]`` 16 kHz samples with ``n <= 480000``; zero-padded to 480,000.
    Returns:
        float32 ``[B, n_mels, 3000]`` on the input's device.
    """
    if windows.dim() == 1:
        windows = windows[None]
    x = torch.nn.functional.pad(windows.float(), (0, CHUNK_SAMPLES - windows.shape[-1]))
    window = torch.hann_window(N_FFT, device=x.device)
    stft = torch.stft(x, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    mel = _filters(n_mels, str(x.device)) @ power
    log = torch.clamp(mel, min=1e-10).log10()
    log = torch.maximum(log, log.amax(dim=(-2, -1), keepdim=True) - 8.0)
    return (log + 4.0) / 4.0
