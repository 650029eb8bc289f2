"""The batched fbank (``features.fbank_batch``) against the per-recording one CAM++ was trained on
(``campplus.fbank``, torchaudio's Kaldi fbank), at ragged lengths in one zero-padded batch."""

from __future__ import annotations

import pytest
import torch

from transcription.diarization.campplus import fbank
from transcription.diarization.features import HOP, WIN, fbank_batch, num_frames

LENGTHS = [WIN, WIN + 1, WIN + HOP - 1, WIN + HOP, 16000, 77_777, 160_000 + 123]


def test_padded_rows_match_the_kaldi_fbank_of_each_row_alone():
    g = torch.Generator().manual_seed(0)
    rows = [(torch.randn(n, generator=g) * 0.1).clamp(-1, 1) for n in LENGTHS]
    rows[2] = torch.sin(torch.arange(LENGTHS[2]) * 0.3) * 0.5  # a tone: mel bins far below the peak
    batch = torch.zeros(len(rows), max(LENGTHS))
    for i, r in enumerate(rows):
        batch[i, : r.numel()] = r
    feats, frames = fbank_batch(batch, torch.tensor(LENGTHS))
    assert feats.shape == (len(rows), num_frames(max(LENGTHS)), 80) and feats.dtype == torch.float32
    for i, r in enumerate(rows):
        ref = fbank(r)
        assert int(frames[i]) == ref.shape[0] == num_frames(r.numel())
        # float32 log-mel energies of order 10: the same ops in another order differ by a few ulps
        torch.testing.assert_close(feats[i, : ref.shape[0]], ref, atol=1e-4, rtol=0)
        assert not feats[i, ref.shape[0] :].any()  # padding frames are zero


def test_num_frames_and_short_input():
    assert num_frames(WIN - 1) == 0 and num_frames(WIN) == 1 and num_frames(WIN + HOP) == 2
    assert num_frames(torch.tensor([0, WIN, WIN + HOP])).tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        fbank_batch(torch.zeros(1, WIN - 1), torch.tensor([WIN - 1]))
