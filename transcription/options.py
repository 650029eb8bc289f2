"""The default output budget of a Whisper window (the options of a transcription are
:class:`diarist.contract.options.TranscribeOptions`)."""

from __future__ import annotations

import math

WHISPER_TOKENS_PER_S = 10.0
"""Output budget rate for a Whisper window: fast speech is ~4-5 text tokens/s plus a timestamp pair every
few seconds, so 10 tokens/s leaves 2x headroom (the MOSS-TD peer, sgl-project/sglang-omni
#1034, uses the same factor)."""


def window_budget(window_s: float) -> int:
    """Default ``max_new_tokens`` of one Whisper window: ``max(64, ceil(10 * window_s))`` tokens, later
    clamped by the scheduler to the context left (448 minus the prompt for Whisper)."""
    return max(64, math.ceil(WHISPER_TOKENS_PER_S * window_s))
