"""What a recording's window results say about the whole transcript: finish reason, metrics, completeness."""

from __future__ import annotations

from engine.request import FinishReason, Sequence
from transcription.decode_quality import LOOP
from transcription.window_decoder import WindowResult


def window_finish(results: list[WindowResult], canceled: bool) -> FinishReason:
    """``abort`` after a cancel; ``repetition`` (or ``length``, when that was the kept attempt's stop) when a
    window still looped after every fallback and resume; else ``stop``: a loop that a later attempt
    recovered from is not reported, since no text was lost."""
    if canceled:
        return FinishReason.ABORT
    for r in results:
        if r.flag == LOOP:
            return FinishReason.LENGTH if r.seq.finish_reason == FinishReason.LENGTH else FinishReason.REPETITION
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


def incomplete_reason(results: list[WindowResult]) -> str | None:
    """Why the transcript misses text: the windows that still looped after every fallback and resume
    (seconds), or ``None`` when none did (low-confidence windows keep their text: flagged, not missing)."""
    bad = [r for r in results if r.flag == LOOP]
    if not bad:
        return None
    spans = ", ".join(f"{r.window.start:.1f}-{r.end:.1f} s" for r in bad[:5]) + (" ..." if len(bad) > 5 else "")
    return (f"decoding still looped after every temperature fallback in {len(bad)} window(s) ({spans}); "
            f"their segments are flagged '{LOOP}'")
