"""CAM++ on zero-padded batches of ragged length: the network of ``campplus.py``, same weights, with every
operation that mixes time steps restricted to each row's valid frames, so a row of a padded batch gives the
embedding its unpadded self gives (up to float summation order; the differential test is
``tests/transcription/diarization/test_campplus_batch.py``).

Which operations mix time, and how each is kept inside a row's ``L`` valid frames:

- convolutions with a time kernel > 1 (the FCM's 3x3 convs, the TDNN's k5 stride 2, each CAM layer's
  ``linear_local`` k3): their input is zeroed beyond ``L``, which is exactly the zero padding the unpadded
  row's convolution sees at its end;
- the CAM layer's context (the mean over the whole utterance plus the mean of each 100-frame segment): means
  over valid frames only (a row's last segment is as short as it is unpadded, as ``ceil_mode`` pooling does);
- statistics pooling: mean and unbiased standard deviation over valid frames.

Everything else (batch norm in eval mode, ReLU, 1x1 convolutions, concatenation) acts frame by frame. Padded
batches have fixed shapes, so the stage (``stage.py``) can bucket them and replay CUDA graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transcription.diarization.campplus import CAMPPlus, _CAMLayer, _DenseBlock, _ResBlock2d


def time_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    """float32 ``[B, 1, t]``: 1 on each row's first ``lengths[b]`` steps, 0 after."""
    return (torch.arange(t, device=lengths.device)[None, :] < lengths[:, None]).float().unsqueeze(1)


def _res_block(blk: _ResBlock2d, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    y = F.relu(blk.bn1(blk.conv1(x * m)))
    y = blk.bn2(blk.conv2(y * m))
    return F.relu(y + blk.shortcut(x))


def head(model: CAMPPlus, feats: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """The FCM front end of a padded batch.

    Args:
        feats: float32 ``[B, T, 80]`` fbank (mean-normalised, zero beyond ``frames``).
        frames: int64 ``[B]`` valid frames per row.
    Returns:
        float32 ``[B, 320, T]``; columns at and beyond ``frames[b]`` are not meaningful.
    """
    fcm = model.head
    m = time_mask(frames, feats.shape[1]).unsqueeze(1)  # [B, 1, 1, T]
    x = F.relu(fcm.bn1(fcm.conv1(feats.transpose(1, 2).unsqueeze(1) * m)))
    for layer in (fcm.layer1, fcm.layer2):
        for blk in layer:
            x = _res_block(blk, x, m)
    x = F.relu(fcm.bn2(fcm.conv2(x * m)))
    return x.flatten(1, 2)


def _cam(layer: _CAMLayer, x: torch.Tensor, m: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    t, seg = x.shape[-1], layer.segment
    xm = x * m
    mean = xm.sum(-1, keepdim=True) / count
    # segment means over valid frames: the pooled sums of x over the pooled counts of the mask
    seg_sum = F.avg_pool1d(xm, seg, seg, ceil_mode=True)
    seg_cnt = F.avg_pool1d(m, seg, seg, ceil_mode=True)
    seg_mean = seg_sum / seg_cnt.clamp_min(1.0 / seg)
    context = mean + seg_mean.repeat_interleave(seg, dim=-1)[..., :t]
    return layer.linear_local(xm) * torch.sigmoid(layer.linear2(F.relu(layer.linear1(context))))


def _dense_block(block: _DenseBlock, x: torch.Tensor, m: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    for layer in block.children():
        y = layer.nonlinear2(layer.linear1(layer.nonlinear1(x)))
        x = torch.cat([x, _cam(layer.cam_layer, y, m, count)], dim=1)
    return x


def xvector(model: CAMPPlus, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Embeddings of a padded batch of front-end frames.

    Args:
        x: float32 ``[B, 320, T]`` FCM output frames (10 ms), row ``b`` valid up to ``lengths[b]`` (>= 2).
        lengths: int64 ``[B]``.
    Returns:
        float32 ``[B, 192]`` (not normalised), as ``model.xvector`` gives each row alone.
    """
    xv = model.xvector
    x = x * time_mask(lengths, x.shape[-1])
    x = xv.tdnn(x)  # k5 stride 2 pad 2 on zero-padded input: the valid outputs are the unpadded ones
    half = (lengths - 1) // 2 + 1
    m = time_mask(half, x.shape[-1])
    count = half.view(-1, 1, 1).float()
    for i in (1, 2, 3):
        x = getattr(xv, f"transit{i}")(_dense_block(getattr(xv, f"block{i}"), x, m, count))
    x = xv.out_nonlinear(x)
    mean = (x * m).sum(-1) / count[..., 0]
    var = (((x - mean.unsqueeze(-1)) * m) ** 2).sum(-1) / (count[..., 0] - 1).clamp_min(1.0)
    stats = torch.cat([mean, var.sqrt()], dim=-1)
    return xv.dense(stats.unsqueeze(-1)).squeeze(-1)
