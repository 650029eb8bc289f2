"""The quality checks of one Whisper attempt (OpenAI Whisper's thresholds, our loop guard, the VAD)."""

from __future__ import annotations

import zlib

import pytest

from engine.request import FinishReason
from transcription.decode_quality import (
    COMPRESSION_RATIO_MAX,
    LOOP,
    LOW_CONFIDENCE,
    REPETITIVE,
    TRUNCATED,
    AttemptQuality,
    compression_ratio,
)


def q(finish=FinishReason.STOP, cr=1.5, lp=-0.3, nsp=0.01, vad=0.9) -> AttemptQuality:
    return AttemptQuality(0.0, finish, cr, lp, nsp, vad)


def test_compression_ratio_is_whispers():
    text = "yeah, " * 40
    assert compression_ratio(text) == pytest.approx(len(text.encode()) / len(zlib.compress(text.encode())))
    assert compression_ratio(text) > COMPRESSION_RATIO_MAX
    assert compression_ratio("And so my fellow Americans, ask not what your country can do for you.") < 2.0
    assert compression_ratio("") == 0.0


@pytest.mark.parametrize(("attempt", "failed", "flag"), [
    (q(), False, None),
    (q(finish=FinishReason.REPETITION), True, LOOP),
    # the budget alone is no loop: truncated text, kept as it is (no fallback), flagged max_new_tokens
    (q(finish=FinishReason.LENGTH), False, TRUNCATED),
    (q(finish=FinishReason.LENGTH, cr=3.0), True, LOOP),  # the budget stopped text that repeats
    (q(finish=FinishReason.LENGTH, lp=-1.2), True, TRUNCATED),  # retried for confidence; text still cut
    (q(cr=2.5), True, REPETITIVE),
    (q(lp=-1.2), True, LOW_CONFIDENCE),
    (q(lp=-1.2, cr=3.0), True, REPETITIVE),
    (q(finish=FinishReason.REPETITION, lp=-1.2, cr=3.0), True, LOOP),
])
def test_failure_and_flag(attempt, failed, flag):
    assert attempt.failed is failed and attempt.flag == flag


@pytest.mark.parametrize(("attempt", "silence"), [
    (q(nsp=0.7, lp=-1.2), True),  # the reference decoder's skip rule
    (q(nsp=0.7, lp=-0.5, vad=0.6), True),  # the VAD is unsure too
    (q(nsp=0.7, lp=-0.5, vad=0.9), False),  # confident text on audio the VAD is sure of
    (q(nsp=0.7, lp=-0.5, vad=None), False),  # no VAD: the reference rule alone
    (q(nsp=0.5, lp=-1.5, vad=0.3), False),  # the model hears speech: never dropped
    (q(nsp=None, lp=-1.5, vad=0.3), False),  # no no-speech probability (multilingual prompt)
])
def test_silence_needs_the_model_and_one_more_doubt(attempt, silence):
    assert attempt.silence is silence
    if silence:
        assert not attempt.failed  # silence is never decoded again


def test_best_attempt_prefers_an_end_of_text_then_logprob():
    attempts = [q(finish=FinishReason.REPETITION, lp=-0.1), q(lp=-1.4), q(lp=-1.2), q(cr=2.6, lp=-0.2)]
    assert max(attempts, key=AttemptQuality.rank) is attempts[3]  # repeated speech, decoded confidently
    assert max(attempts[:3], key=AttemptQuality.rank) is attempts[2]
    cut = [q(finish=FinishReason.REPETITION, lp=-0.1), q(finish=FinishReason.LENGTH, lp=-0.3), q(lp=-1.5)]
    assert max(cut, key=AttemptQuality.rank) is cut[2]  # the only one whose text was not cut short
