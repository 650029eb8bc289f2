"""The result of one transcription as it crosses a process boundary: finish reasons, metrics, shape checks.

The pipeline (``transcription.result``) builds the result as a JSON object: ``duration`` (seconds),
``language``/``language_source``/``language_probability``/``task``, ``model``, ``segments`` (objects with
``start``, ``end`` in seconds, ``text``, ``speaker``, ``words``?, ``channel``?, ``flags``?),
``finish_reason`` (:data:`FINISH_REASONS`), ``speech`` (detected speech ``[[start, end], ...]``),
``coverage``/``incomplete``/``incomplete_reason`` (``diarist.completeness``), ``no_speech``, ``warnings``,
``turns``?, and ``metrics`` (:class:`EngineMetrics` fields plus the pipeline's own timings).
:meth:`diarist.transcript.Transcript.from_engine` normalises it into the service's schema; :func:`check_result`
is the check at the engine server's stream, so a malformed result is a clear error there rather than a
``KeyError`` further on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from diarist.contract.errors import ProtocolError

FINISH_REASONS = ("stop", "length", "repetition", "abort", "error")
"""Why decoding ended: anything but ``stop`` means the transcript may be cut short (the engine's
``engine.request.FinishReason`` values)."""


def _m(doc: str) -> Any:
    return field(default=None, metadata={"doc": doc})


@dataclass
class EngineMetrics:
    """What one transcription cost the engine, in the fields the job's metrics row keeps
    (``diarist.models.JobMetrics``) and the API shows (``api.schemas.Metrics``); seconds unless named.

    Over several engine sequences (Whisper windows): ``queue_wait_s`` from the first arrival to the first
    admission, the stage times the longest sequence's, tokens summed.
    """

    queue_wait_s: float | None = _m("seconds from submission to the first admission into the engine")
    encoder_s: float | None = _m("seconds in the audio encoder")
    prefill_s: float | None = _m("seconds of prompt prefill")
    decode_s: float | None = _m("seconds of token decoding")
    prompt_tokens: int | None = _m("prompt tokens over all engine sequences")
    output_tokens: int | None = _m("output tokens over all engine sequences")
    processing_s: float | None = _m("seconds from the request to its result, audio decode included")
    rtf: float | None = _m("processing seconds / audio seconds")

    def to_json(self) -> dict[str, Any]:
        """The metrics that are set, as a JSON object (a result's ``metrics`` adds the pipeline's own)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


METRIC_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EngineMetrics))
"""The metric names with a column of their own; any other metric of a result is kept as extra."""


def check_result(raw: Any) -> dict[str, Any]:
    """``raw`` if it has the shape of a result (above), for the service to normalise.

    Checked: a JSON object; ``duration`` a finite number >= 0; ``finish_reason`` one of
    :data:`FINISH_REASONS`; ``segments`` a list of objects each with a string ``text`` and a number or
    ``null`` ``start``/``end``; ``metrics`` an object. Other fields are the service's to read leniently.

    Raises:
        ProtocolError: the first rule broken, named.
    """
    if not isinstance(raw, dict):
        raise ProtocolError(f"the result must be a JSON object, not {type(raw).__name__}")
    duration = raw.get("duration")
    if not _number(duration) or duration < 0:
        raise ProtocolError(f"the result's duration must be a finite number >= 0, not {duration!r}")
    if raw.get("finish_reason") not in FINISH_REASONS:
        raise ProtocolError(f"the result's finish_reason must be one of {', '.join(FINISH_REASONS)}, "
                            f"not {raw.get('finish_reason')!r}")
    segments = raw.get("segments")
    if not isinstance(segments, list):
        raise ProtocolError(f"the result's segments must be a list, not {type(segments).__name__}")
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict) or not isinstance(seg.get("text"), str):
            raise ProtocolError(f"segment {i} of the result must be an object with a string text: {seg!r}")
        if not all(seg.get(k) is None or _number(seg[k]) for k in ("start", "end")):
            raise ProtocolError(f"segment {i} of the result has a start or end that is not a number: {seg!r}")
    if not isinstance(raw.get("metrics"), dict):
        raise ProtocolError("the result's metrics must be a JSON object")
    return raw


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
