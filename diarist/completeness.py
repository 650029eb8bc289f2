"""Is a transcript complete? Coverage and the ``incomplete`` rule, written once.

Both the pipeline (``transcription/transcriber.py``, at the end of every recording) and the service
(:meth:`diarist.transcript.Transcript.from_engine`, for every result it stores or renders) call
:func:`assess`; it only reads facts the engine result carries, so the two always agree.

**Coverage** is transcribed speech over detected speech: the seconds of detected speech (the VAD's
regions, ``result["speech"]``, less any span the model itself judged not to be speech,
``result["non_speech"]``) that some segment's ``[start, end]`` covers, divided by all detected speech
seconds. A window whose tail was lost (a loop stopped, a budget ran out, a failed decode) leaves its
speech uncovered and lowers it; a transcript that ends early but covered every word it had does not
(coverage is not "last end time / duration"). Short pauses inside one speaker's segment are covered by
that segment, and a gap of at most :data:`SEAM_GAP_S` between two consecutive segments counts as covered
(Whisper's timestamps snap to 20 ms and its segments abut with small gaps). ``None`` when the result has
no speech detection to compare with (e.g. results saved by older versions), ``1.0`` when no speech was
detected.

**Incomplete** (with a reason for people) when any of:

- ``finish_reason`` is not ``stop`` (budget, loop guard, abort, engine error);
- the pipeline already marked it (``result["incomplete"]`` with ``incomplete_reason``);
- the model's output had to be repaired by the parser (MOSS-TD's ``result["parse_issues"]``: a last
  segment without an end time, a cut-off tag, ...; the text is kept);
- a segment is flagged as coming from a window that still failed after re-decoding (its
  ``"incomplete": true``; the segment's text is the best attempt, so it counts as transcribed);
- more than :data:`MAX_UNCOVERED_S` seconds *and* more than :data:`MAX_UNCOVERED_FRACTION` of the
  detected speech have no text.

Torch-free: the API imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

SEAM_GAP_S = 0.5
"""Largest gap between two consecutive segments that still counts as covered (seconds)."""
MAX_UNCOVERED_S = 10.0
"""Untranscribed detected speech (seconds) tolerated before a transcript is incomplete (with the share below)."""
MAX_UNCOVERED_FRACTION = 0.25
"""Share of detected speech without text tolerated before a transcript is incomplete (with the seconds above)."""

_FINISH_REASONS = {
    "length": "the output token budget ran out before the end of the audio",
    "repetition": "decoding was stopped by the repetition guard",
    "abort": "the request was aborted",
    "error": "the engine failed while decoding",
}


@dataclass(frozen=True)
class Completeness:
    """The verdict on one result: ``coverage`` in [0, 1] or ``None``, ``incomplete`` and its ``reason``."""

    coverage: float | None
    incomplete: bool
    reason: str | None

    def fields(self) -> dict[str, Any]:
        """The result keys this verdict sets: ``coverage``, ``incomplete``, ``incomplete_reason``."""
        return {"coverage": self.coverage, "incomplete": self.incomplete, "incomplete_reason": self.reason}


Span = tuple[float, float]


def _spans(raw: Any) -> list[Span]:
    """Sorted, merged ``(start, end)`` spans from ``[[s, e], ...]`` / ``[{"start", "end"}, ...]`` (bad ones
    dropped)."""
    out = []
    for x in raw or []:
        try:
            s, e = (x["start"], x["end"]) if isinstance(x, dict) else (x[0], x[1])
            s, e = float(s), float(e)
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if e > s:
            out.append((s, e))
    return _merge(out)


def _merge(spans: Iterable[Span], gap: float = 0.0) -> list[Span]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(spans: list[Span]) -> float:
    return sum(e - s for s, e in spans)


def _intersect(a: list[Span], b: list[Span]) -> list[Span]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(a: list[Span], b: list[Span]) -> list[Span]:
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def speech_coverage(segments: Iterable[Any], speech: Any, non_speech: Any = None) -> tuple[float, float]:
    """``(covered seconds, detected speech seconds)`` of ``segments`` (dicts or objects with ``start``,
    ``end``) over ``speech`` less ``non_speech`` (spans as ``[[s, e], ...]`` or ``[{start, end}]``)."""
    detected = _subtract(_spans(speech), _spans(non_speech))
    segs = []
    for seg in segments:
        s = seg.get("start") if isinstance(seg, dict) else getattr(seg, "start", None)
        e = seg.get("end") if isinstance(seg, dict) else getattr(seg, "end", None)
        if s is not None and e is not None:
            segs.append({"start": s, "end": e})
    text = _merge(_spans(segs), gap=SEAM_GAP_S)
    return _length(_intersect(text, detected)), _length(detected)


def assess(result: dict[str, Any]) -> Completeness:
    """The completeness verdict for an engine result dict (keys read: ``finish_reason``, ``segments``,
    ``speech``, ``non_speech``, ``coverage``, ``incomplete``, ``incomplete_reason``, ``parse_issues``); rules in the module
    docstring. Without ``speech`` the result's own ``coverage`` is kept as given (or ``None``). Segments may
    be dicts or objects with ``start``/``end`` (only dicts carry the ``incomplete`` flag)."""
    finish = result.get("finish_reason") or "stop"
    finish = getattr(finish, "value", finish)
    coverage = result.get("coverage")
    uncovered = None
    if result.get("speech") is not None:
        covered, detected = speech_coverage(result.get("segments") or [], result["speech"], result.get("non_speech"))
        coverage = min(1.0, covered / detected) if detected > 0 else 1.0
        uncovered = detected - covered
    elif coverage is not None:
        try:
            coverage = min(1.0, max(0.0, float(coverage)))
        except (TypeError, ValueError):
            coverage = None
    if finish != "stop":
        return Completeness(coverage, True, result.get("incomplete_reason") or _FINISH_REASONS.get(finish, finish))
    if result.get("incomplete"):
        return Completeness(coverage, True, result.get("incomplete_reason") or "marked incomplete by the pipeline")
    if issues := result.get("parse_issues"):
        return Completeness(coverage, True, "malformed model output: " + "; ".join(map(str, issues)))
    failed = _spans(s for s in result.get("segments") or [] if isinstance(s, dict) and s.get("incomplete"))
    if failed:
        where = ", ".join(f"{a:.1f}-{b:.1f} s" for a, b in failed[:5]) + (", ..." if len(failed) > 5 else "")
        return Completeness(coverage, True, f"the text at {where} comes from windows that still failed after "
                                            "re-decoding")
    if (uncovered is not None and coverage is not None and uncovered > MAX_UNCOVERED_S
            and 1.0 - coverage > MAX_UNCOVERED_FRACTION):
        return Completeness(coverage, True, f"{uncovered:.1f} s of the detected speech ({100 * (1 - coverage):.0f}%) "
                                            "has no transcribed text")
    return Completeness(coverage, False, None)
