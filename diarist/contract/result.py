"""The result of one transcription as it crosses a layer or process boundary: finish reasons, metrics, and
the typed result (:class:`TranscriptionResult` of :class:`Segment` of :class:`Word`) with its JSON form.

The pipeline (``transcription.result``) assembles the result as a JSON object internally and hands it over
typed (``TranscriptionResult.from_json`` at the end of ``Transcriber.transcribe``); the engine server writes
it with :meth:`TranscriptionResult.to_json` in its stream's ``result`` line, the HTTP client reads it back
with :meth:`TranscriptionResult.from_json`, which checks every field by name, and
:meth:`diarist.transcript.Transcript.from_engine` normalises it into the service's schema. A malformed result
is a :class:`ProtocolError` at that boundary rather than a ``KeyError`` further on.
"""

from __future__ import annotations

import math
import numbers
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


Speaker = int | str | None
"""A speaker as the pipeline labels it: a cluster index, a ``S01``/``CH1``-style label, or ``None`` (unknown);
the service relabels them (``diarist.transcript``)."""


@dataclass
class Word:
    """One word of a segment: ``word`` (its text, with its leading space), ``start``/``end`` in seconds from
    the start of the recording, and its ``speaker`` once the diarization assigned one."""

    word: str
    start: float | None
    end: float | None
    speaker: Speaker = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Any other field the pipeline wrote (kept on the wire, not interpreted)."""

    def to_json(self) -> dict[str, Any]:
        """The word as a JSON object (``speaker`` only when set)."""
        return _put({"word": self.word, "start": self.start, "end": self.end}, speaker=self.speaker) | self.extra

    @classmethod
    def from_json(cls, raw: Any, where: str = "word") -> Word:
        """The word of ``raw``. Raises :class:`ProtocolError` naming ``where`` and the field broken."""
        r = _Reader(raw, where)
        return cls(r.text("word"), r.num("start"), r.num("end"),
                   r.speaker("speaker"), r.rest())


@dataclass
class Segment:
    """A run of speech: ``start``/``end`` in seconds (``end`` ``None``: an unterminated MOSS-TD segment, which
    the service closes), ``text``, ``speaker``, ``words`` when word timestamps were computed, ``channel``
    (0-based) in a multichannel result, ``flags`` when the text is doubtful (``repetition``, ``repetitive``,
    ``low_confidence``: ``transcription.decode_quality``)."""

    start: float | None
    end: float | None
    text: str
    speaker: Speaker = None
    words: list[Word] | None = None
    channel: int | None = None
    flags: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Any other field the pipeline wrote (kept on the wire, not interpreted)."""

    def to_json(self) -> dict[str, Any]:
        """The segment as a JSON object, the optional fields only when set."""
        out = {"start": self.start, "end": self.end, "text": self.text}
        return _put(out, speaker=self.speaker, words=None if self.words is None else [w.to_json() for w in self.words],
                    channel=self.channel, flags=self.flags) | self.extra

    @classmethod
    def from_json(cls, raw: Any, where: str = "segment") -> Segment:
        """The segment of ``raw``. Raises :class:`ProtocolError` naming ``where`` and the field broken."""
        r = _Reader(raw, where)
        words = r.array("words")
        return cls(r.num("start"), r.num("end"), r.text("text"), r.speaker("speaker"),
                   None if words is None else [Word.from_json(w, f"{where} word {i}") for i, w in enumerate(words)],
                   r.integer("channel"), r.texts("flags"), r.rest())


@dataclass
class SpeakerEmbedding:
    """One speaker's voice in a result: the L2-normalised CAM++ centroid of its speech.

    ``speaker``: the speaker as the result's segments label it; ``vector``: float32 values (192 for CAM++),
    unit length, as a JSON list of numbers; ``model``: the embedding model and its weights' version
    (``campplus@<sha256 prefix of the weights>``: a vector is only ever compared with vectors of the same
    model); ``speech_s``: seconds of the speaker's speech the vector was computed from.
    """

    speaker: Speaker
    vector: list[float]
    model: str
    speech_s: float

    def to_json(self) -> dict[str, Any]:
        """The embedding as a JSON object."""
        return {"speaker": self.speaker, "vector": self.vector, "model": self.model, "speech_s": self.speech_s}

    @classmethod
    def from_json(cls, raw: Any, where: str = "speaker embedding") -> SpeakerEmbedding:
        """The embedding of ``raw``. Raises :class:`ProtocolError` naming ``where`` and the field broken
        (a vector that is empty or holds anything but finite numbers included)."""
        r = _Reader(raw, where)
        speaker, vector = r.speaker("speaker"), r.array("vector", required=True)
        if not vector or not all(_number(v) for v in vector):
            raise ProtocolError(f"{where}: vector must be a non-empty list of finite numbers")
        return cls(speaker, [float(v) for v in vector], r.text("model"), r.num("speech_s", required=True, null=False))


@dataclass
class TranscriptionResult:
    """The result of one transcription, as the pipeline returns it and the engine server's ``result`` line
    carries it (the JSON form: :meth:`to_json`; times in seconds from the start of the recording).

    Always there: ``duration`` (seconds of audio), ``finish_reason`` (:data:`FINISH_REASONS`), ``segments``,
    ``metrics`` (:class:`EngineMetrics`) with the pipeline's own timings and counts in ``pipeline_metrics``
    (``vad_s``, ``windows``, ``diarization_s``, ``audio_decode_s``, ``worker_decode_s``, ...: one JSON
    ``metrics`` object on the wire). Set by every finished result: ``language``/``language_source``/
    ``language_probability``/``task`` (``transcription.language.LanguageChoice``), ``model``, ``speech``
    (detected speech ``[[start, end], ...]``), ``coverage``/``incomplete``/``incomplete_reason``
    (``diarist.completeness``), ``no_speech``, ``warnings`` (``{"code", "message", "count"?}``).
    The family's own (``None`` when absent): ``family`` (``moss-td``; absent for Whisper), ``windows`` (each
    Whisper window's outcome), ``non_speech`` (windows the model judged non-speech), ``turns`` (the
    diarization's ``{"speaker", "start", "end"}``), ``random_weights``, ``repetition``/``marker_interval_s``/
    ``parse_issues``/``sections`` (MOSS-TD), ``engine_id`` (the engine server that ran it),
    ``speaker_embeddings`` (:class:`SpeakerEmbedding`, one per speaker of the segments; absent from results
    of older engines and from multichannel ones). ``extra``: any other field, kept on the wire uninterpreted.
    """

    duration: float
    finish_reason: str
    segments: list[Segment]
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    pipeline_metrics: dict[str, Any] = field(default_factory=dict)
    language: str | None = None
    language_source: str | None = None
    language_probability: float | None = None
    task: str | None = None
    model: str | None = None
    speech: list[list[float]] | None = None
    coverage: float | None = None
    no_speech: bool | None = None
    incomplete: bool | None = None
    incomplete_reason: str | None = None
    warnings: list[dict[str, Any]] | None = None
    family: str | None = None
    windows: list[dict[str, Any]] | None = None
    non_speech: list[list[float]] | None = None
    turns: list[dict[str, Any]] | None = None
    random_weights: bool | None = None
    repetition: Any = None
    marker_interval_s: float | None = None
    parse_issues: list[Any] | None = None
    sections: list[dict[str, Any]] | None = None
    engine_id: str | None = None
    speaker_embeddings: list[SpeakerEmbedding] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The result as the JSON object the wire carries: the fields that are set (``None`` is written as
        absence; every reader takes the two alike), ``metrics`` the engine's and the pipeline's together."""
        out: dict[str, Any] = {"duration": self.duration, "finish_reason": self.finish_reason,
                               "segments": [s.to_json() for s in self.segments],
                               "metrics": self.metrics.to_json() | self.pipeline_metrics}
        for f in fields(self):
            if f.name not in out and f.name not in ("pipeline_metrics", "extra", "speaker_embeddings"):
                _put(out, **{f.name: getattr(self, f.name)})
        if self.speaker_embeddings is not None:
            out["speaker_embeddings"] = [e.to_json() for e in self.speaker_embeddings]
        return out | self.extra

    @classmethod
    def from_json(cls, raw: Any) -> TranscriptionResult:
        """The result ``raw`` (a JSON object) describes, checked field by field.

        Raises:
            ProtocolError: not an object, a missing ``duration``/``finish_reason``/``segments``/``metrics``,
                or a field of the wrong type (named): ``duration`` a finite number >= 0, ``finish_reason``
                one of :data:`FINISH_REASONS`, segments with a string ``text`` and number-or-null times.
        """
        r = _Reader(raw, "the result")
        duration = r.num("duration", required=True, null=False)
        if duration < 0:
            raise ProtocolError(f"the result's duration must be a finite number >= 0, not {duration!r}")
        finish = r.value("finish_reason")
        if not isinstance(finish, str) or finish not in FINISH_REASONS:
            raise ProtocolError(f"the result's finish_reason must be one of {', '.join(FINISH_REASONS)}, "
                                f"not {finish!r}")
        segments = r.array("segments", required=True)
        metrics = r.obj("metrics", required=True)
        engine = {k: metrics[k] for k in METRIC_FIELDS if k in metrics}
        voices = r.array("speaker_embeddings")
        for k, v in engine.items():
            if v is not None and not _number(v):
                raise ProtocolError(f"the result's metrics.{k} must be a number, not {v!r}")
        return cls(
            duration=duration, finish_reason=finish,
            segments=[Segment.from_json(s, f"segment {i} of the result") for i, s in enumerate(segments)],
            metrics=EngineMetrics(**engine), pipeline_metrics={k: v for k, v in metrics.items() if k not in engine},
            language=r.text("language", null=True), language_source=r.text("language_source", null=True),
            language_probability=r.num("language_probability"), task=r.text("task", null=True),
            model=r.text("model", null=True), speech=r.array("speech"), coverage=r.num("coverage"),
            no_speech=r.flag("no_speech"), incomplete=r.flag("incomplete"),
            incomplete_reason=r.text("incomplete_reason", null=True), warnings=r.array("warnings"),
            family=r.text("family", null=True), windows=r.array("windows"), non_speech=r.array("non_speech"),
            turns=r.array("turns"), random_weights=r.flag("random_weights"), repetition=r.value("repetition"),
            marker_interval_s=r.num("marker_interval_s"), parse_issues=r.array("parse_issues"),
            sections=r.array("sections"), engine_id=r.text("engine_id", null=True),
            speaker_embeddings=None if voices is None else [
                SpeakerEmbedding.from_json(v, f"speaker embedding {i} of the result") for i, v in enumerate(voices)],
            extra=r.rest())


def check_result(raw: Any) -> dict[str, Any]:
    """``raw`` if :meth:`TranscriptionResult.from_json` takes it. Raises :class:`ProtocolError` otherwise."""
    TranscriptionResult.from_json(raw)
    return raw


def _put(out: dict[str, Any], **values: Any) -> dict[str, Any]:
    """``out`` with the ``values`` that are not ``None``."""
    out.update((k, v) for k, v in values.items() if v is not None)
    return out


class _Reader:
    """Reads the fields of one JSON object, each once, raising :class:`ProtocolError` with ``where`` and the
    field's name for a missing or mistyped one; :meth:`rest` is what no read took."""

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, dict):
            raise ProtocolError(f"{where} must be a JSON object, not {type(raw).__name__}: {str(raw)[:200]}")
        self.raw, self.where, self.taken = raw, where, set()

    def _get(self, key: str, required: bool) -> Any:
        self.taken.add(key)
        if key not in self.raw and required:
            raise ProtocolError(f"{self.where} has no {key!r}")
        return self.raw.get(key)

    def _bad(self, key: str, kind: str, v: Any) -> ProtocolError:
        return ProtocolError(f"{self.where}: {key} must be {kind}, not {str(v)[:200]!r}")

    def num(self, key: str, required: bool = False, null: bool = True) -> Any:
        v = self._get(key, required)
        if (v is None and null) or _number(v):
            return v
        raise self._bad(key, "a finite number", v)

    def text(self, key: str, null: bool = False) -> Any:
        v = self._get(key, required=not null)
        if isinstance(v, str) or (v is None and null):
            return v
        raise self._bad(key, "a string", v)

    def integer(self, key: str) -> Any:
        v = self._get(key, False)
        if v is None or (isinstance(v, numbers.Integral) and not isinstance(v, bool)):
            return v
        raise self._bad(key, "an integer", v)

    def flag(self, key: str) -> Any:
        v = self._get(key, False)
        if v is None or isinstance(v, bool):
            return v
        raise self._bad(key, "true or false", v)

    def speaker(self, key: str) -> Any:
        v = self._get(key, False)
        if v is None or isinstance(v, str) or (isinstance(v, numbers.Integral) and not isinstance(v, bool)):
            return v
        raise self._bad(key, "a speaker label (a string or an integer)", v)

    def array(self, key: str, required: bool = False) -> Any:
        v = self._get(key, required)
        if (v is None and not required) or isinstance(v, list):
            return v
        raise self._bad(key, "a list", v)

    def texts(self, key: str) -> Any:
        v = self.array(key)
        if v is None or all(isinstance(x, str) for x in v):
            return v
        raise self._bad(key, "a list of strings", v)

    def obj(self, key: str, required: bool = False) -> Any:
        v = self._get(key, required)
        if (v is None and not required) or isinstance(v, dict):
            return v
        raise self._bad(key, "a JSON object", v)

    def value(self, key: str) -> Any:
        return self._get(key, False)

    def rest(self) -> dict[str, Any]:
        return {k: v for k, v in self.raw.items() if k not in self.taken}


def _number(v: Any) -> bool:
    # numbers.Real: numpy scalars from the pipeline count too; an int beyond float range is not finite
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False
