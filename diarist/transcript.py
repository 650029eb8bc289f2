"""The one transcript schema every Diarist output is built from.

All times are seconds (float) from the start of the recording. A transcript is
normalised once, in :meth:`Transcript.from_engine`, so that every exporter in
:mod:`diarist.formats` can rely on its invariants:

- segments sorted by ``start``; every time clamped to ``[0, duration]``; ``end >= start``;
- within one speaker, segments never go back in time (``start >= end`` of that
  speaker's previous segment);
- speakers relabelled ``S01``, ``S02``, ... in order of first appearance over the whole
  recording (never restarted per window), ``None`` kept for "speaker unknown";
- ``coverage`` = transcribed speech / detected speech and ``incomplete`` with its reason, both from
  :func:`diarist.completeness.assess` (the pipeline applies the same rule), so a truncated decode is visible;
- times rounded to the millisecond (rounding is monotonic, so the invariants above survive it), which
  every export format can represent and no alignment method resolves better.

This module must stay free of torch and of the engine: the service's API and
worker processes import it.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from diarist.completeness import assess
from diarist.contract.options import TASKS
from diarist.contract.result import FINISH_REASONS, SpeakerEmbedding, TranscriptionResult
from diarist.contract.result import Segment as ResultSegment
from diarist.decode_windows import DecodeWindow, read_windows
from diarist.times import round_seconds

FinishReason = Literal[FINISH_REASONS]  # type: ignore[valid-type] - the contract's one list
UNKNOWN_SPEAKER = "unknown"
"""How an output names a speaker that is not known (``speaker`` ``None``) where it must name one: RTTM,
``diarized_json``, the speaker timeline's lane."""

# Labels that already mean "speaker N" (cluster ids, MOSS-TD tags); any other string
# (e.g. a channel label) is remembered in ``speaker_names`` when relabelled.
_NUMERIC_LABEL = re.compile(r"(?:S|SPK|SPEAKER_?)?\d+", re.IGNORECASE)
# Han, kana, CJK punctuation and full-width forms: scripts written without spaces between words
_CJK_CHAR = re.compile(r"[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")


class Word(BaseModel):
    """One word with its time span (seconds) and, after assignment, its speaker label."""

    model_config = ConfigDict(allow_inf_nan=False)

    word: str
    start: float = Field(ge=0, description="seconds")
    end: float = Field(ge=0, description="seconds")
    speaker: str | None = None


class Segment(BaseModel):
    """A run of speech by one speaker.

    ``id`` is the 0-based position in the transcript; ``start``/``end`` are seconds;
    ``speaker`` is ``S01``-style or ``None`` (unknown); ``channel`` is the source audio
    channel (0-based) for multichannel jobs, else ``None``; ``words`` is present when
    word timestamps were computed; ``flags`` lists what makes the text doubtful, when anything does:
    ``repetition`` (its window still looped after every temperature fallback: text may be missing),
    ``repetitive`` (its text compresses like a loop: a hallucinated repetition, or speech that repeats) or
    ``low_confidence`` (every attempt's mean log-probability was low: words may be wrong); see
    ``transcription.decode_quality``. ``language`` is the language its window was decoded in (multilingual
    Whisper, which detects it per window: ``transcription.language``), else ``None``.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    id: int
    speaker: str | None
    start: float = Field(ge=0, description="seconds")
    end: float = Field(ge=0, description="seconds")
    text: str
    words: list[Word] | None = None
    channel: int | None = None
    flags: list[str] | None = None
    language: str | None = None


class SpeakerTurn(BaseModel):
    """A stretch of time (seconds) in which one speaker talks, from the diarization itself (not from the
    transcribed text). Turns of two speakers may overlap (overlapped speech)."""

    model_config = ConfigDict(allow_inf_nan=False)

    speaker: str
    start: float = Field(ge=0, description="seconds")
    end: float = Field(ge=0, description="seconds")


class ResultWarning(BaseModel):
    """Something about the input or the run that the transcript's reader should know, though the job
    completed: ``code`` (stable machine code, e.g. ``invalid_samples``), ``message`` (for people),
    ``count`` (how many times it happened, when countable)."""

    code: str
    message: str
    count: int | None = None


class SpeakerIdentity(BaseModel):
    """Who a speaker is, when known: ``name`` (shown by every export in place of the label), and when a voice
    profile named it, that profile's ``profile_id`` and ``match_score`` (cosine similarity of the speaker's
    voice and the profile, at or above the match threshold; ``diarist.speakers``). A name given after the
    fact (``PATCH /v1/jobs/{id}/speakers``) has no score. ``name`` ``None``: not identified."""

    model_config = ConfigDict(allow_inf_nan=False)

    name: str | None = None
    profile_id: str | None = None
    match_score: float | None = None


class Transcript(BaseModel):
    """A speaker-attributed, time-stamped transcript of one recording.

    Fields: ``duration`` (seconds of audio), ``language`` (ISO 639-1 code of the speech or ``None``),
    ``language_source`` (``requested``: the request's; ``detected``: by the model, with
    ``language_probability`` in [0, 1]; ``assumed``: an English-only model, which cannot detect; ``None``:
    unknown), ``task`` (``transcribe``, or ``translate``: the text is English whatever ``language`` is),
    ``model`` (name of the model that produced it), ``speakers`` (labels in order of
    first appearance), ``segments``, ``finish_reason`` (why decoding ended; anything but
    ``stop`` means the transcript may be cut short), ``coverage`` (transcribed speech /
    detected speech in [0, 1], :mod:`diarist.completeness`; ``None`` when the result carries no
    speech detection), ``no_speech`` (no speech was found), ``incomplete``/``incomplete_reason``
    (the transcript may miss speech, and why: :func:`diarist.completeness.assess`), ``speaker_names`` (label -> original name for labels that came from
    named sources such as channels; ``None`` otherwise), ``turns`` (who spoke when, from the
    diarization cascade; ``None`` when the model gives speakers only through its segments, as
    MOSS-TD does, or for multichannel jobs). RTTM export and DER use the turns when present.
    ``speakers`` lists the segments' speakers first, then any speaker that has turns but no words.
    ``random_weights``: the engine ran random (``load_format=dummy``) weights, so the text is noise.
    ``marker_interval_s``: the MOSS-TD time-marker interval (seconds) its prompt used; ``None`` for Whisper.
    ``warnings``: :class:`ResultWarning` items (e.g. NaN samples replaced, :mod:`diarist.pcm`).
    ``windows``: the Whisper decode windows with their scores (:mod:`diarist.decode_windows`; verbose_json's
    per-segment ``avg_logprob``, ``no_speech_prob``...); ``None`` for MOSS-TD.
    ``identities``: label -> :class:`SpeakerIdentity` for every speaker once identification ran (the job's
    ``speaker_profiles``) or a speaker was named; ``None`` otherwise. Exports show :meth:`display` names.
    The speakers' voice vectors (:attr:`voices`) are not part of the transcript: the worker keeps them apart.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    duration: float = Field(ge=0, description="seconds")
    language: str | None = None
    language_source: Literal["requested", "detected", "assumed"] | None = None
    language_probability: float | None = Field(None, ge=0, le=1)
    task: Literal[TASKS] = "transcribe"  # type: ignore[valid-type]
    model: str
    speakers: list[str] = Field(default_factory=list)
    segments: list[Segment] = Field(default_factory=list)
    finish_reason: FinishReason = "stop"
    coverage: float | None = None
    no_speech: bool = False
    incomplete: bool = False
    incomplete_reason: str | None = None
    speaker_names: dict[str, str] | None = None
    turns: list[SpeakerTurn] | None = None
    random_weights: bool = False
    marker_interval_s: float | None = None
    warnings: list[ResultWarning] = Field(default_factory=list)
    windows: list[DecodeWindow] | None = None
    identities: dict[str, SpeakerIdentity] | None = None
    _voices: dict[str, SpeakerEmbedding] = PrivateAttr(default_factory=dict)

    @property
    def voices(self) -> dict[str, SpeakerEmbedding]:
        """label -> the speaker's voice vector, from the engine result (:meth:`from_engine`); never serialised."""
        return self._voices

    def display(self, label: str | None) -> str | None:
        """What exports write for a speaker ``label``: its identity's name when it has one, else the label."""
        ident = (self.identities or {}).get(label) if label is not None else None
        return ident.name if ident is not None and ident.name else label

    @property
    def text(self) -> str:
        """All segment texts in order (no speaker labels, no times), joined by single spaces,
        except between two CJK segments, which are written without a space."""
        out = ""
        for s in self.segments:
            if out and not (_CJK_CHAR.match(out[-1]) and _CJK_CHAR.match(s.text[0])):
                out += " "
            out += s.text
        return out

    @classmethod
    def from_engine(cls, result: TranscriptionResult) -> Transcript:
        """Normalise an engine transcription result (:class:`diarist.contract.result.TranscriptionResult`, all
        times seconds) into a :class:`Transcript`.

        Speakers may be ints, ``"S03"``-style strings, channel labels or ``None``. A segment ``end`` of
        ``None`` (an unterminated MOSS-TD segment) becomes the next segment's start, else the duration.
        Segments whose text is empty after whitespace collapsing are dropped. Turns are clamped to
        ``[0, duration]``; a turn without a finite ``start`` and ``end``, of zero length after clamping, or
        without a speaker is dropped. A result read from JSON: :meth:`from_engine_json`.

        Raises ``ValueError`` when ``duration`` is negative or not finite or ``finish_reason`` is unknown
        (pydantic ``ValidationError`` is a ValueError).
        """
        duration = _finite(result.duration)
        if duration is None or duration < 0:
            raise ValueError(f"engine result has no valid duration: {result.duration!r}")
        raw = sorted(result.segments, key=lambda s: _finite(s.start) or 0.0)
        timed = _clamp_segments(raw, duration)
        timed = _monotonic_per_speaker(timed)
        timed.sort(key=lambda s: s["start"])  # stable: per-speaker order is kept

        labels: dict[Any, str] = {}
        names: dict[str, str] = {}

        def label(value: Any) -> str | None:
            key = _speaker_key(value)
            if key is None:
                return None
            if key not in labels:
                labels[key] = f"S{len(labels) + 1:02d}"
                if isinstance(value, str) and not _NUMERIC_LABEL.fullmatch(value.strip()):
                    names[labels[key]] = value.strip()
            return labels[key]

        segments = []
        for s in timed:
            speaker = label(s["speaker"])
            words = None
            if s["words"] is not None:
                words = [
                    Word(word=w["word"], start=_ms(w["start"]), end=_ms(w["end"]),
                         speaker=label(w["speaker"]) if w["speaker"] is not None else speaker)
                    for w in s["words"]
                ]
            segments.append(Segment(id=len(segments), speaker=speaker, start=_ms(s["start"]), end=_ms(s["end"]),
                                    text=s["text"], words=words, channel=s["channel"], flags=s["flags"],
                                    language=s.get("language")))

        turns = None
        if result.turns is not None:
            turns = []
            # turns are the diarization's free-form objects (speaker, start, end): read leniently
            for tr in sorted((x for x in result.turns if isinstance(x, dict)),
                             key=lambda x: _finite(x.get("start")) or 0.0):
                start, end = _finite(tr.get("start")), _finite(tr.get("end"))
                if start is None or end is None:  # a turn without its times says nothing about when
                    continue
                start, end = _ms(_clamp(start, 0.0, duration)), _ms(_clamp(end, 0.0, duration))
                speaker = label(tr.get("speaker"))
                if end > start and speaker is not None:
                    turns.append(SpeakerTurn(speaker=speaker, start=start, end=end))
            if not turns and segments:  # no usable turn: the segments are the better account of who spoke
                turns = None

        duration = _ms(duration)
        finish = result.finish_reason or "stop"
        verdict = assess({**result.to_json(), "finish_reason": finish})  # the pipeline's input: the same verdict
        coverage = None if verdict.coverage is None else round(verdict.coverage, 4)
        no_speech = bool(result.no_speech) or (not segments and finish == "stop")
        out = cls(
            duration=duration, language=result.language or None, language_source=result.language_source or None,
            language_probability=_finite(result.language_probability), task=result.task or "transcribe",
            model=str(result.model or "unknown"), speakers=list(labels.values()), segments=segments,
            finish_reason=finish, coverage=coverage, no_speech=no_speech, incomplete=verdict.incomplete,
            incomplete_reason=verdict.reason, speaker_names=names or None, turns=turns,
            random_weights=bool(result.random_weights), marker_interval_s=_finite(result.marker_interval_s),
            warnings=[ResultWarning.model_validate(w) for w in result.warnings or [] if isinstance(w, dict)],
            windows=read_windows(result.windows, duration),
        )
        for v in result.speaker_embeddings or []:
            key = _speaker_key(v.speaker)
            if key in labels:  # a voice of a speaker with no kept segment or turn has no label to name
                out._voices[labels[key]] = v
        return out

    @classmethod
    def from_engine_json(cls, raw: Any) -> Transcript:
        """:meth:`from_engine` of a result in its JSON form (a saved raw result, a test's fixture).

        Raises:
            ProtocolError: ``raw`` is not a result (:meth:`TranscriptionResult.from_json`).
            ValueError: what :meth:`from_engine` raises.
        """
        return cls.from_engine(TranscriptionResult.from_json(raw))


def _finite(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond float range
        return None
    return f if math.isfinite(f) else None


def _speaker_key(value: Any) -> Any:
    """Key under which two engine speaker values count as the same speaker."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):  # bool is an int subclass; not a speaker id
        return ("str", str(value))
    if isinstance(value, numbers.Integral):  # numpy integers are the same ids as Python ints
        return ("int", int(value))
    return ("str", str(value).strip())


def _clamp(t: float | None, lo: float, hi: float) -> float:
    return lo if t is None else min(hi, max(lo, t))


_ms = round_seconds  # the short name this module's normalisation uses (diarist.times)


def _clamp_segments(raw: list[ResultSegment], duration: float) -> list[dict]:
    """Clamp segment and word times to [0, duration]; fill missing ends; drop empty text."""
    out = []
    for i, s in enumerate(raw):
        start = _clamp(_finite(s.start), 0.0, duration)
        end = _finite(s.end)
        if end is None:  # unterminated: runs until the next segment or the end of audio
            nxt = next((_finite(r.start) for r in raw[i + 1:] if _finite(r.start) is not None), None)
            end = duration if nxt is None else nxt
        end = _clamp(end, start, duration)
        text = " ".join(s.text.split())
        if not text:
            continue
        words = None
        if s.words is not None:
            words, prev_end = [], 0.0
            for w in s.words:
                if not w.word.strip():
                    continue
                ws = _clamp(_finite(w.start), prev_end, duration)
                we = _clamp(_finite(w.end), ws, duration)
                words.append({"word": w.word, "start": ws, "end": we, "speaker": w.speaker})
                prev_end = we
        out.append({"speaker": s.speaker, "start": start, "end": end, "text": text, "words": words,
                    "channel": s.channel, "flags": s.flags or None,
                    "language": s.extra.get("language") if isinstance(s.extra.get("language"), str) else None})
    return out


def _monotonic_per_speaker(segs: list[dict]) -> list[dict]:
    """Make each speaker's segments non-overlapping and in time order (input sorted by start).

    A segment that starts before the same speaker's previous end is moved to start at
    that end (its end is kept if later), so a speaker never "talks twice at once".
    Unknown speakers (None) are left alone: they may be different people.
    """
    last_end: dict[Any, float] = {}
    for s in segs:
        key = _speaker_key(s["speaker"])
        if key is None:
            continue
        prev = last_end.get(key)
        if prev is not None and s["start"] < prev:
            s["start"] = prev
            s["end"] = max(s["end"], prev)
        last_end[key] = s["end"]
    return segs
