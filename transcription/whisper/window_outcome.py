"""What a recording's window results say about the whole transcript: finish reason, metrics, completeness,
warnings."""

from __future__ import annotations

from engine.request import FinishReason, Sequence
from transcription.decode_quality import LOOP, TRUNCATED
from transcription.whisper.window_decoder import WindowResult

FAILED_WINDOWS = "failed_windows"
"""Result warning code: windows whose every decode attempt failed its quality checks (``status: failed``);
their best text is kept, flagged, and the transcript is incomplete."""

MAYBE_NOT_ENGLISH = "language_may_not_be_english"
"""Result warning code of an English-only checkpoint: speech that failed every attempt is often speech in
another language, which such a model writes as invented English (tiny.en on the shared Chinese and
Japanese clips: every attempt below the log-probability floor)."""


def window_finish(results: list[WindowResult], canceled: bool) -> FinishReason:
    """``abort`` after a cancel; ``repetition`` (or ``length``, when that was the kept attempt's stop) when a
    window still looped after every fallback and resume; ``length`` when a window stopped at its token budget
    without looping (:data:`TRUNCATED`); else ``stop``: a loop that a later attempt recovered from is not
    reported, since no text was lost."""
    if canceled:
        return FinishReason.ABORT
    for r in results:
        if r.flag == LOOP:
            return FinishReason.LENGTH if r.seq.finish_reason == FinishReason.LENGTH else FinishReason.REPETITION
    if any(r.flag == TRUNCATED for r in results):
        return FinishReason.LENGTH
    return FinishReason.STOP


def window_metrics(results: list[WindowResult], seqs: list[Sequence]) -> dict:
    """Counts for the job's metrics: ``windows`` (final windows), ``decode_attempts`` (engine sequences,
    retries included), ``windows_refed`` (windows whose tail a later window decoded again: seams and
    resumes), ``windows_no_speech`` (taken as silence), ``windows_failed`` (still failing, flagged) and
    ``failed_s`` (seconds of audio in failed windows)."""
    failed = [r for r in results if r.status == "failed"]
    return {"windows": len(results), "decode_attempts": len(seqs),
            "windows_refed": sum(1 for r in results if r.end < r.window.end - 1e-6),
            "windows_no_speech": sum(1 for r in results if r.status == "no_speech"),
            "windows_failed": len(failed), "failed_s": sum(r.end - r.window.start for r in failed)}


def _spans(results: list[WindowResult]) -> str:
    """The first five windows' spans (seconds), for a message."""
    return ", ".join(f"{r.window.start:.1f}-{r.end:.1f} s" for r in results[:5]) + (" ..." if len(results) > 5 else "")


def _truncation_message(cut: list[WindowResult]) -> str:
    limits = sorted({r.seq.max_new_tokens for r in cut})
    return (f"decoding stopped at the token limit (max_new_tokens {', '.join(map(str, limits))}) in {len(cut)} "
            f"window(s) ({_spans(cut)}); their segments are flagged '{TRUNCATED}'")


def _failed_message(failed: list[WindowResult]) -> str:
    flags = sorted({r.flag for r in failed if r.flag})
    return (f"every decode attempt failed its quality checks in {len(failed)} window(s) ({_spans(failed)}); "
            f"their best text is kept and flagged {', '.join(repr(f) for f in flags)}, and may be wrong")


def incomplete_reason(results: list[WindowResult]) -> str | None:
    """Why the transcript cannot be trusted whole: the windows that still looped after every fallback and
    resume, those whose every attempt failed otherwise (a low mean log-probability or text that compresses
    like a loop: their best text is kept, but it may be invented), and those stopped at their token budget
    (seconds); ``None`` when none did."""
    reasons = []
    if bad := [r for r in results if r.flag == LOOP]:
        reasons.append(f"decoding still looped after every temperature fallback in {len(bad)} window(s) "
                       f"({_spans(bad)}); their segments are flagged '{LOOP}'")
    if failed := [r for r in results if r.status == "failed" and r.flag not in (LOOP, TRUNCATED)]:
        reasons.append(_failed_message(failed))
    if cut := [r for r in results if r.flag == TRUNCATED]:
        reasons.append(_truncation_message(cut))
    return "; ".join(reasons) or None


def window_warnings(results: list[WindowResult], english_only: bool) -> list[dict]:
    """The result warnings (``{code, message, count}``, ``count`` the windows) the windows call for:
    :data:`FAILED_WINDOWS` when a window failed every attempt, and then :data:`MAYBE_NOT_ENGLISH` too when
    the checkpoint is English-only (``english_only``); :data:`TRUNCATED` when a window stopped at its token
    budget without looping."""
    out = []
    if failed := [r for r in results if r.status == "failed"]:
        out.append({"code": FAILED_WINDOWS, "count": len(failed), "message": _failed_message(failed)})
        if english_only:
            out.append({"code": MAYBE_NOT_ENGLISH, "count": len(failed),
                        "message": f"the speech at {_spans(failed)} failed every decode attempt of this "
                                   "English-only model; it may not be English (an English-only model writes "
                                   "other languages as invented English: use a multilingual model)"})
    if cut := [r for r in results if r.flag == TRUNCATED]:
        out.append({"code": TRUNCATED, "count": len(cut), "message": _truncation_message(cut)})
    return out
