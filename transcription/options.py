"""What a caller asks of one transcription: :class:`TranscribeOptions`, and the default Whisper window budget."""

from __future__ import annotations

import math
from dataclasses import dataclass

WHISPER_TOKENS_PER_S = 10.0
"""Output budget rate for a Whisper window: fast speech is ~4-5 text tokens/s plus a timestamp pair every
few seconds, so 10 tokens/s leaves 2x headroom (the MOSS-TD peer, sgl-project/sglang-omni
#1034, uses the same factor)."""


def window_budget(window_s: float) -> int:
    """Default ``max_new_tokens`` of one Whisper window: ``max(64, ceil(10 * window_s))`` tokens, later
    clamped by the scheduler to the context left (448 minus the prompt for Whisper)."""
    return max(64, math.ceil(WHISPER_TOKENS_PER_S * window_s))


@dataclass
class TranscribeOptions:
    """Per-request options (names follow OpenAI / AssemblyAI).

    Attributes:
        language: ISO 639-1 code of the speech. An English-only Whisper (tiny.en) refuses any other
            (``unsupported_language``) instead of writing English-sounding text for it; a multilingual one
            decodes in it, and detects the language when it is ``None`` (:mod:`transcription.language`).
        task: ``transcribe`` (text in the speech's language) or ``translate`` (English text; multilingual
            Whisper only, else ``unsupported_task``).
        prompt: text that conditions the decoder (vocabulary, spelling).
        num_speakers / min_speakers / max_speakers: hints for speaker clustering.
        multichannel: one speaker per channel: transcribe each channel, label by channel.
        max_new_tokens: output budget per sequence (tokens); default from the model and duration.
        diarize: run the speaker cascade (Whisper); False labels everything as one speaker.
        word_timestamps: compute word times (needed to split segments at speaker changes).
        admission_class: the engine admission class of every sequence of this request
            (``engine.request.ADMISSION_CLASSES``: the job's duration class, ``short`` or ``long``, or
            ``default``); the engine admits each class against its own limit.
    """

    language: str | None = None
    task: str = "transcribe"
    prompt: str | None = None
    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None
    multichannel: bool = False
    max_new_tokens: int | None = None
    diarize: bool = True
    word_timestamps: bool = True
    admission_class: str = "default"
