"""Multichannel recordings with one talker per channel (call-centre stereo, per-person headsets): each channel
is transcribed on its own and its segments are labelled with the channel's speaker index. Overlapping
speech on different channels is kept on both; no clustering is involved."""

from __future__ import annotations

import numpy as np

from transcription.diarization.turns import Turn

DISTINCT_CORRELATION = 0.9
"""Channels whose waveforms correlate above this are copies of one mix (e.g. mono saved as stereo)."""


def distinct_channels(samples: np.ndarray) -> bool:
    """True when a ``[channels, n]`` float recording has at least two channels that are not copies of one
    another (Pearson correlation of the waveforms <= ``DISTINCT_CORRELATION`` for some pair), so
    per-channel labelling makes sense. Silent channels count as not distinct."""
    if samples.ndim != 2 or samples.shape[0] < 2 or samples.shape[1] < 2:
        return False
    x = samples.astype(np.float64)
    x = x - x.mean(1, keepdims=True)
    norm = np.linalg.norm(x, axis=1)
    live = norm > 1e-6 * np.sqrt(x.shape[1])
    if live.sum() < 2:
        return False
    x = x[live] / norm[live, None]
    corr = x @ x.T
    return bool((np.abs(corr[np.triu_indices(len(x), 1)]) <= DISTINCT_CORRELATION).any())


def label_channels(per_channel: list[list[dict]]) -> list[dict]:
    """Merge per-channel transcripts into one list labelled by channel.

    Args:
        per_channel: ``per_channel[c]`` is channel ``c``'s segments (dicts with ``start``, ``end``,
            ``text``, optional ``words``), each list in time order.
    Returns:
        Copies of all segments with ``speaker = c`` (and ``channel = c``; words get the same speaker),
        sorted by start time, then channel. Speakers are channel indices, not first-appearance order.
    """
    out = []
    for c, segs in enumerate(per_channel):
        for seg in segs:
            s = {**seg, "speaker": c, "channel": c}
            if seg.get("words"):
                s["words"] = [dict(w, speaker=c) for w in seg["words"]]
            out.append(s)
    out.sort(key=lambda s: (s["start"], s["channel"]))
    return out


def channel_turns(per_channel_speech: list[list[tuple[float, float]]]) -> list[Turn]:
    """Turns from each channel's speech regions (``detect_speech`` per channel), speaker = channel index,
    sorted by start. Turns of different channels may overlap (simultaneous talkers)."""
    turns = [Turn(s, e, c) for c, regions in enumerate(per_channel_speech) for s, e in regions]
    return sorted(turns, key=lambda t: (t.start, t.speaker))
