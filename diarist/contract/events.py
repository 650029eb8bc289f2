"""The events of one transcription, as the pipeline reports them and as the engine server streams them.

The pipeline calls ``on_event(kind, payload)`` (``transcription.progress.EventFn``) with the kinds below;
the engine server sends each as one line of newline-delimited JSON, ``{"type": kind, **payload}``
(:func:`to_line`), and ends the stream with a :class:`ResultLine` or an :class:`ErrorLine`; the worker's
client reads each line back with :func:`from_line`, which checks it, so a malformed line is a
:class:`~diarist.contract.errors.ProtocolError` naming what is wrong rather than a ``KeyError``.

=========== =========================== ========================================================
type        fields                      when
=========== =========================== ========================================================
stage       stage                       a stage of the pipeline begins (:data:`STAGES`; a family
                                        skips those it has not, e.g. MOSS-TD has no ``speakers``)
queued      duration (s)                the audio is decoded, before any engine work
started     (none)                      the first text is about to stream
delta       text                        new transcript text (coalesced; in time order)
segment     start, end (s), text,       a segment is final (``end`` may be null: an unterminated
            speaker                     MOSS-TD segment; ``speaker`` null for Whisper, labelled later)
finished    finish_reason, metrics      the transcription ended (:data:`~diarist.contract.result.FINISH_REASONS`)
result      result                      the last line: the whole result (:mod:`diarist.contract.result`)
error       code, message               the last line instead: a :class:`~diarist.contract.errors.CodedError`
=========== =========================== ========================================================

Fields not listed are ignored when read (a newer server may add some); a missing one, a wrong type or an
unknown ``type`` is an error.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

from diarist.contract.errors import CodedError, ProtocolError
from diarist.contract.result import FINISH_REASONS, TranscriptionResult

_NUM, _STR, _OBJ = "a number", "a string", "an object"


def _f(kind: str, nullable: bool = False, default: Any = ...) -> Any:
    """A field whose JSON value is ``kind`` (``null`` too when ``nullable``)."""
    meta = {"kind": kind, "nullable": nullable}
    return field(metadata=meta) if default is ... else field(default=default, metadata=meta)


STAGES = ("decode", "speech_detection", "transcription", "speakers")
"""The pipeline's stages in the order they run: the file is decoded to PCM, speech is detected (silero-vad),
the model transcribes, the speaker cascade labels the segments (Whisper with diarization)."""


@dataclass(frozen=True)
class Stage:
    """A stage of the pipeline begins (one of :data:`STAGES`); it lasts until the next stage or ``finished``."""

    type: ClassVar[str] = "stage"
    stage: str = _f(_STR)


@dataclass(frozen=True)
class Queued:
    """The audio is decoded (``duration`` seconds) and about to enter the engine."""

    type: ClassVar[str] = "queued"
    duration: float = _f(_NUM)


@dataclass(frozen=True)
class Started:
    """The first text of the transcript is about to stream."""

    type: ClassVar[str] = "started"


@dataclass(frozen=True)
class Delta:
    """New transcript text, to append to what came before."""

    type: ClassVar[str] = "delta"
    text: str = _f(_STR)


@dataclass(frozen=True)
class SegmentDone:
    """A final segment: ``start``/``end`` seconds (``end`` ``None``: not terminated), ``text``, ``speaker``
    (the model's label, or ``None`` until the speaker cascade has run)."""

    type: ClassVar[str] = "segment"
    start: float | None = _f(_NUM, nullable=True)
    end: float | None = _f(_NUM, nullable=True)
    text: str = _f(_STR)
    speaker: str | int | None = _f("a label", nullable=True, default=None)


@dataclass(frozen=True)
class Finished:
    """The transcription ended with ``finish_reason``; ``metrics`` are its timings and token counts."""

    type: ClassVar[str] = "finished"
    finish_reason: str = _f(_STR)
    metrics: Mapping[str, Any] = _f(_OBJ)


@dataclass(frozen=True)
class ResultLine:
    """The stream's last line when the transcription succeeded: the whole result (its JSON form on the wire:
    :meth:`TranscriptionResult.to_json`, read back with :meth:`TranscriptionResult.from_json`)."""

    type: ClassVar[str] = "result"
    result: TranscriptionResult = _f(_OBJ)  # noqa: RUF009 - a field() with metadata, no shared default


@dataclass(frozen=True)
class ErrorLine:
    """The stream's last line when it failed: a coded error (:meth:`as_error` raises it again)."""

    type: ClassVar[str] = "error"
    code: str = _f(_STR)
    message: str = _f(_STR)

    @classmethod
    def of(cls, error: CodedError) -> ErrorLine:
        """The line that carries ``error``."""
        return cls(error.code, error.message)


Event = Stage | Queued | Started | Delta | SegmentDone | Finished
"""A progress event (what ``on_event`` receives)."""
Line = Event | ResultLine | ErrorLine
"""Any line of the engine server's stream."""
_TYPES: dict[str, type] = {c.type: c for c in (Stage, Queued, Started, Delta, SegmentDone, Finished, ResultLine,
                                                ErrorLine)}


def payload(line: Line) -> dict[str, Any]:
    """The fields of ``line`` without its type: the ``payload`` of ``on_event(kind, payload)``."""
    return {"result": line.result.to_json()} if isinstance(line, ResultLine) else asdict(line)


def to_line(line: Line) -> str:
    """``line`` as one NDJSON line (``\\n``-terminated): numpy scalars as numbers, other non-JSON values as
    strings."""
    return json.dumps({"type": line.type, **payload(line)}, default=_json_default) + "\n"


def _json_default(v: Any) -> Any:
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    return str(v)


def make(kind: str, values: dict[str, Any]) -> Line:
    """The typed line of ``kind`` from its fields (extra fields ignored), checked as :func:`from_line` does.

    Raises:
        ProtocolError: an unknown kind, a missing field or one of the wrong type, a stage not in :data:`STAGES`, a
            finish reason that is not one of :data:`~diarist.contract.result.FINISH_REASONS`, or a result of the wrong shape.
    """
    cls = _TYPES.get(kind)
    if cls is None:
        raise ProtocolError(f"unknown event type {kind!r} (known: {', '.join(_TYPES)})")
    args = {}
    for f in fields(cls):
        if f.name not in values:
            if f.default is not MISSING:
                continue
            raise ProtocolError(f"{kind} event without its {f.name!r}")
        v = values[f.name]
        if not _is(v, f.metadata["kind"], f.metadata["nullable"]):
            raise ProtocolError(f"{kind} event: {f.name} must be {f.metadata['kind']}, not {v!r}")
        args[f.name] = v
    if kind == "stage" and args["stage"] not in STAGES:
        raise ProtocolError(f"stage event: unknown stage {args['stage']!r} (known: {', '.join(STAGES)})")
    if kind == "finished" and args["finish_reason"] not in FINISH_REASONS:
        raise ProtocolError(f"finished event: unknown finish_reason {args['finish_reason']!r}")
    if kind == "result":
        args["result"] = TranscriptionResult.from_json(args["result"])
    return cls(**args)


def from_line(text: str | bytes) -> Line:
    """One line of the stream, parsed and checked (:func:`make`).

    Raises:
        ProtocolError: not JSON, not an object, no ``type``, or what :func:`make` refuses.
    """
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ProtocolError(f"engine stream line is not JSON ({e}): {str(text)[:200]!r}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ProtocolError(f"engine stream line is not an object with a type: {str(text)[:200]!r}")
    return make(raw.pop("type"), raw)


def _is(v: Any, kind: str, nullable: bool) -> bool:
    if v is None:
        return nullable
    if kind == _NUM:  # numbers.Real: numpy scalars from the pipeline count too
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
    if kind == _STR:
        return isinstance(v, str)
    if kind == _OBJ:
        return isinstance(v, dict)
    return isinstance(v, str | numbers.Integral) and not isinstance(v, bool)  # a speaker label



