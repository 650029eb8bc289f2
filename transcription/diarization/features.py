"""CAM++'s input features for a batch of zero-padded waveforms at once, on any device.

The same Kaldi-compatible log-mel fbank as :func:`transcription.diarization.campplus.fbank` (25 ms Povey
windows every 10 ms, DC offset removed and pre-emphasis 0.97 per frame, 512-point power spectrum, 80
triangular mel bins from 20 Hz to Nyquist, natural log floored at float32 epsilon, no dither; the steps of
``torchaudio.compliance.kaldi.fbank``), written over a ``[B, n]`` batch so one call featurises every group
of a batch on the device. Every frame depends only on its own 400 samples, so the frames that fit inside a
row's true length are those of the unpadded row; the per-row mean that CAM++ subtracts is taken over
those frames only. ``tests/transcription/diarization/test_features.py`` pins the match.
"""

from __future__ import annotations

import functools

import torch

from transcription.audio import SAMPLE_RATE

WIN = 400
"""Samples per analysis window (25 ms)."""
HOP = 160
"""Samples between frames (10 ms)."""
NFFT = 512
"""FFT size (the window zero-padded to a power of two, as Kaldi does)."""
MELS = 80
PREEMPHASIS = 0.97


def num_frames(num_samples: torch.Tensor | int):
    """Frames of ``num_samples`` samples (Kaldi's ``snip_edges``: only windows that fit; 0 below 400)."""
    if isinstance(num_samples, int):
        return 0 if num_samples < WIN else 1 + (num_samples - WIN) // HOP
    return torch.where(num_samples < WIN, 0, 1 + (num_samples - WIN).clamp(min=0) // HOP)


@functools.lru_cache(maxsize=8)
def _constants(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(Povey window ``[400]``, mel matrix ``[257, 80]``) on ``device``, float32."""
    from torchaudio.compliance.kaldi import get_mel_banks

    window = torch.hann_window(WIN, periodic=False, dtype=torch.float32).pow(0.85)
    banks, _ = get_mel_banks(MELS, NFFT, float(SAMPLE_RATE), 20.0, 0.0, 100.0, -500.0, 1.0)
    banks = torch.nn.functional.pad(banks.float(), (0, 1))  # the Nyquist bin has no weight
    return window.to(device), banks.T.contiguous().to(device)


def fbank_batch(waves: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean-normalised log-mel fbank of zero-padded rows.

    Args:
        waves: float32 ``[B, n]`` 16 kHz samples in [-1, 1], row ``b`` valid up to ``lengths[b]``.
        lengths: int64 ``[B]`` valid samples per row (on ``waves``' device).
    Returns:
        ``(feats, frames)``: float32 ``[B, T, 80]`` with ``T = num_frames(n)``, each row minus the mean of
        its first ``frames[b]`` frames and zero beyond them; int64 ``[B]`` ``num_frames(lengths)``.
    Raises:
        ValueError: ``n`` shorter than one window.
    """
    if waves.shape[1] < WIN:
        raise ValueError(f"fbank needs at least {WIN} samples per row, got {waves.shape[1]}")
    window, banks = _constants(str(waves.device))
    x = waves.float().mul(32768.0).unfold(1, WIN, HOP)  # [B, T, 400], a view
    x = x - x.mean(-1, keepdim=True)
    x = x - PREEMPHASIS * torch.cat([x[..., :1], x[..., :-1]], dim=-1)
    spec = torch.fft.rfft(x * window, n=NFFT).abs().pow(2.0)  # [B, T, 257]
    feats = torch.matmul(spec, banks).clamp_min(torch.finfo(torch.float32).eps).log()
    frames = num_frames(lengths)
    valid = (torch.arange(feats.shape[1], device=feats.device)[None, :] < frames[:, None]).unsqueeze(-1)
    mean = (feats * valid).sum(1, keepdim=True) / frames.clamp(min=1).view(-1, 1, 1)
    return (feats - mean) * valid, frames
