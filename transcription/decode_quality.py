"""How good one decode of a Whisper window is, and whether to decode it again (temperature fallback).

The checks and thresholds are OpenAI Whisper's (``whisper/transcribe.py``: ``temperature=(0.0, 0.2, ...,
1.0)``, ``compression_ratio_threshold=2.4``, ``logprob_threshold=-1.0``, ``no_speech_threshold=0.6``), also
faster-whisper's defaults, plus our loop guard (``transcription.repetition``):

- an attempt **fails** when the loop guard stopped it (``repetition``), its text compresses more than 2.4x
  with zlib (a repetitive transcript), or its mean token log-probability is below -1;
- an attempt that ran out of budget (``length``) without repeating is **truncated**, not a loop: the
  default budget is twice dense speech, but a smaller ``max_new_tokens`` stops fluent text; decoding it again
  at another temperature would stop at the same limit, so it is kept as it is and flagged
  :data:`TRUNCATED` (the transcript is incomplete);
- an attempt is **silence** (no text kept, no fallback) when the model's no-speech probability is above
  0.6 and either its mean log-probability is below -1 (the reference decoder's skip rule) or the VAD is
  unsure of the window (Silero's mean probability over the window's speech frames below
  :data:`VAD_CONFIDENT`). Every window already passed the VAD, so text is dropped only where the model
  doubts the audio too; on music and effects the model says "Mmm." or "Thank you." with a fair
  log-probability, and there the VAD's own doubt decides. Speech the VAD is sure of keeps the reference
  rule alone;
- when every temperature fails, the best attempt is kept: one that reached its end-of-text before one the
  loop guard or the budget stopped (text lost), then the higher mean log-probability. Unlike
  faster-whisper, an attempt over the compression threshold is not put last: speech that really repeats
  (a chant, a clip played twice) compresses like a loop, and a confident greedy decode of it beats the
  garbled text high temperatures give.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from engine.request import FinishReason, Sequence
from transcription.whisper.decoding import forced_tokens

TEMPERATURE_STEP = 0.2
"""How much hotter each retry of a failed decode samples (openai-whisper's
``temperature_increment_on_fallback``)."""


def temperature_schedule(start: float | None = None) -> tuple[float, ...]:
    """The temperatures a decode is tried at, in turn: ``start`` (a request's ``temperature``; ``None``:
    0, greedy), then :data:`TEMPERATURE_STEP` hotter each time up to 1.0, as openai-whisper's ``transcribe``
    builds its fallback list from ``--temperature`` (``np.arange(t, 1.0 + 1e-6, 0.2)``).

    Raises:
        ValueError: ``start`` outside 0..1.
    """
    t0 = 0.0 if start is None else float(start)
    if not 0.0 <= t0 <= 1.0:
        raise ValueError(f"temperature must be between 0 and 1, not {start!r}")
    return tuple(round(t0 + i * TEMPERATURE_STEP, 6) for i in range(int((1.0 - t0) / TEMPERATURE_STEP + 1e-6) + 1))


TEMPERATURES = temperature_schedule()
"""Decoding temperatures tried in turn for a window whose decode fails, by default (0 is greedy)."""

FALLBACK_SEED = 0
"""Seed of every sampled attempt's generator: a recording transcribes the same way on every run."""

COMPRESSION_RATIO_MAX = 2.4
"""Text whose UTF-8 bytes compress more than this (zlib) is a repetition loop."""

LOGPROB_MIN = -1.0
"""An attempt whose mean token log-probability (nats) is below this is not trusted."""

NO_SPEECH_MIN = 0.6
"""No-speech probability above which a low-confidence window is taken as silence (no text)."""

VAD_CONFIDENT = 0.8
"""Mean Silero speech probability (over a window's speech frames) at and above which the VAD is sure."""

LOOP = "repetition"
"""Flag of a window whose kept attempt the loop guard stopped, or the budget stopped in text that repeats:
text after it may be missing (the transcript is incomplete)."""

TRUNCATED = "max_new_tokens"
"""Flag (and result warning code) of a window whose kept attempt stopped at its token budget
(``max_new_tokens``, finish ``length``) in text that does not repeat: the rest of the window's speech is
missing (the transcript is incomplete), and no loop is reported."""

REPETITIVE = "repetitive"
"""Flag of a window whose kept attempt reached end-of-text but compresses like a loop: a hallucinated
repetition, or speech that really repeats (text kept, marked for review; the transcript is not incomplete)."""

LOW_CONFIDENCE = "low_confidence"
"""Flag of a window whose every attempt was below :data:`LOGPROB_MIN` (text kept, words may be wrong)."""


def compression_ratio(text: str) -> float:
    """UTF-8 length over zlib-compressed length of ``text`` (OpenAI Whisper's ``get_compression_ratio``);
    0 for empty text."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass(frozen=True)
class AttemptQuality:
    """The checks of one decode of a window.

    Attributes:
        temperature: the attempt's sampling temperature.
        finish_reason: the engine's finish reason of the attempt.
        compression_ratio: of the whole decoded text (loop included).
        avg_logprob: mean log-probability of the output tokens (nats; 0 when there are none).
        no_speech_prob: the model's no-speech probability at the start of the window, or ``None`` when the
            model gives none (the prompt does not end with ``<|startoftranscript|>``).
        vad_confidence: the VAD's mean speech probability over the window's speech frames, or ``None``.
    """

    temperature: float
    finish_reason: FinishReason | None
    compression_ratio: float
    avg_logprob: float
    no_speech_prob: float | None
    vad_confidence: float | None = None

    @property
    def looped(self) -> bool:
        """The loop guard stopped it, or its text compresses like a loop (a budget stop alone is not one)."""
        return self.finish_reason == FinishReason.REPETITION or self.compression_ratio > COMPRESSION_RATIO_MAX

    @property
    def truncated(self) -> bool:
        """It stopped at its token budget (``length``) without looping: text is missing, but not a loop."""
        return self.finish_reason == FinishReason.LENGTH and not self.looped

    @property
    def low_confidence(self) -> bool:
        return self.avg_logprob < LOGPROB_MIN

    @property
    def silence(self) -> bool:
        """The model says no speech, and it is not confident of its text or the VAD is unsure."""
        if self.no_speech_prob is None or self.no_speech_prob <= NO_SPEECH_MIN:
            return False
        vad_unsure = self.vad_confidence is not None and self.vad_confidence < VAD_CONFIDENT
        return self.low_confidence or vad_unsure

    @property
    def failed(self) -> bool:
        """Needs another temperature (silence never does: there is nothing to recover)."""
        return not self.silence and (self.looped or self.low_confidence)

    @property
    def flag(self) -> str | None:
        """:data:`LOOP`, :data:`REPETITIVE`, :data:`TRUNCATED`, :data:`LOW_CONFIDENCE`, or ``None`` for an
        attempt that passed. A stop before end-of-text outranks the quality flags: it means missing text."""
        if self.silence:
            return None
        if self.looped and self.finish_reason in (FinishReason.REPETITION, FinishReason.LENGTH):
            return LOOP
        if self.looped:
            return REPETITIVE
        if self.truncated:
            return TRUNCATED
        return LOW_CONFIDENCE if self.low_confidence else None

    def rank(self) -> tuple[bool, float]:
        """Sort key of the best attempt (larger is better): reached end-of-text first, then the mean
        log-probability."""
        return (self.finish_reason not in (FinishReason.REPETITION, FinishReason.LENGTH), self.avg_logprob)

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "compression_ratio": round(self.compression_ratio, 3),
                "avg_logprob": round(self.avg_logprob, 4),
                "no_speech_prob": _round(self.no_speech_prob), "vad_confidence": _round(self.vad_confidence)}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def assess(seq: Sequence, text: str, vad_confidence: float | None = None) -> AttemptQuality:
    """The checks of a finished attempt: ``text`` is its whole decoded text (special tokens dropped);
    ``vad_confidence`` the VAD's mean speech probability over the window (``None``: unknown)."""
    lps = seq.output_logprobs[forced_tokens(seq) :]  # forced tokens (language, task) were not decoded
    return AttemptQuality(temperature=seq.sampling.temperature, finish_reason=seq.finish_reason,
                          compression_ratio=compression_ratio(text),
                          avg_logprob=sum(lps) / len(lps) if lps else 0.0,
                          no_speech_prob=seq.mm_state.get("no_speech_prob"), vad_confidence=vad_confidence)
