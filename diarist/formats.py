"""Exporters from a :class:`~diarist.transcript.Transcript` to every output format we serve.

Formats (``render(transcript, fmt)`` names, media type, source of the format):

- ``json``: our schema (:class:`Transcript`), ``application/json``.
- ``txt``: one speaker-labelled line per segment, ``[0.52-2.31] S01: text``, ``text/plain``.
- ``text``: the plain transcript text without speakers or times (OpenAI ``text``).
- ``srt``: SubRip, composed with the ``srt`` package; speaker as an ``S01: `` prefix
  (SubRip has no speaker markup), ``application/x-subrip``.
- ``vtt``: WebVTT (W3C WebVTT, cue text with ``<v S01>`` voice spans), ``text/vtt``.
- ``rttm``: NIST RTTM, 10 fields ``SPEAKER <file-id> 1 <start> <dur> <NA> <NA> <speaker>
  <NA> <NA>``, one line per segment, ``text/plain``.
- ``svg``: the speaker timeline (who spoke when: one lane per speaker, segments as bars, overlaps), an
  SVG 1.1 image drawn by :func:`diarist.speaker_timeline.to_svg`, ``image/svg+xml``.
- ``verbose_json`` / ``diarized_json``: OpenAI ``/v1/audio/transcriptions`` response
  shapes (see docs/api_conventions.md §1.6).

The OpenAI-compatible route (the API's and the engine server's) renders with :func:`render_openai`:
its ``json`` is OpenAI's ``{text, usage}``. Every OpenAI shape that is JSON (``json``, ``verbose_json``,
``diarized_json``, and the stream's final ``transcript.text.done`` event, :func:`openai_done_event`)
carries our completeness as extra fields (:func:`completeness_fields`: ``finish_reason``,
``incomplete``, ``incomplete_reason``, ``coverage``, ``warnings``); OpenAI clients ignore fields they
do not know. Text shapes (``text``, ``srt``, ``vtt``) carry them as response headers
(:func:`completeness_headers`).

Speakers are written as :meth:`Transcript.display` gives them: a known speaker's name (``identities``:
matched to a voice profile or named after the fact), else its label (``S01``); RTTM replaces whitespace in a
name with ``_`` (its fields are space-separated). ``json`` keeps the labels and carries ``identities``.
Times are seconds everywhere. Segments whose speaker is unknown (``None``) are written
without a speaker in txt/srt/vtt and as ``unknown`` where a label is mandatory (RTTM,
diarized_json). Nothing here imports torch or the engine.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Callable

from diarist.decode_windows import DecodeWindow, window_of
from diarist.speaker_timeline import to_svg
from diarist.transcript import UNKNOWN_SPEAKER, ResultWarning, Segment, Transcript


def to_json(t: Transcript) -> str:
    """Our full schema as UTF-8 JSON text (2-space indent, non-ASCII kept)."""
    return json.dumps(t.model_dump(mode="json"), ensure_ascii=False, indent=2) + "\n"


def to_txt(t: Transcript) -> str:
    """Speaker-labelled lines ``[start-end] S01: text`` (seconds, 2 decimals), one per segment.

    A segment without a known speaker is written ``[start-end] text``. An empty
    transcript gives an empty string.
    """
    lines = []
    for s in t.segments:
        who = f"{t.display(s.speaker)}: " if s.speaker else ""
        lines.append(f"[{s.start:.2f}-{s.end:.2f}] {who}{s.text}")
    return "".join(line + "\n" for line in lines)


def to_text(t: Transcript) -> str:
    """The transcript text alone (OpenAI ``response_format=text``), newline-terminated."""
    return t.text + "\n" if t.text else ""


def to_srt(t: Transcript) -> str:
    """SubRip subtitles, one cue per segment, composed by the ``srt`` package.

    Zero-length segments get a 1 ms cue so no player drops them.
    """
    import srt

    cues = [
        srt.Subtitle(index=i + 1, start=_td(s.start), end=_td(max(s.end, s.start + 0.001)),
                     content=(f"{t.display(s.speaker)}: " if s.speaker else "") + s.text)
        for i, s in enumerate(t.segments)
    ]
    return srt.compose(cues)


def _td(seconds: float) -> _dt.timedelta:
    return _dt.timedelta(milliseconds=round(seconds * 1000))


def _vtt_time(seconds: float) -> str:
    ms = round(seconds * 1000)
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"


def _vtt_escape(text: str) -> str:
    # WebVTT cue text: '&' and '<' start markup, '>' would end "-->" look-alikes.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _vtt_voice(label: str) -> str:
    # A voice annotation ends at '>' and may not hold a line break (spaces are fine: "<v Alice Chen>").
    return " ".join(re.sub(r"[<>&]+", "_", label).split()) or "_"


def to_vtt(t: Transcript) -> str:
    """WebVTT with one cue per segment; known speakers as voice spans ``<v S01>text</v>``."""
    out = ["WEBVTT", ""]
    for s in t.segments:
        end = max(s.end, s.start + 0.001)
        body = _vtt_escape(s.text)
        if s.speaker:
            body = f"<v {_vtt_voice(t.display(s.speaker))}>{body}</v>"
        out += [f"{_vtt_time(s.start)} --> {_vtt_time(end)}", body, ""]
    return "\n".join(out) + ("\n" if t.segments else "")


def to_rttm(t: Transcript, file_id: str = "audio") -> str:
    """NIST RTTM speaker turns: the diarization's ``turns`` when the transcript has them (they may
    overlap), else one ``SPEAKER`` line per segment of positive length.

    ``file_id`` is the recording name (whitespace replaced by ``_`` since RTTM is
    space-separated). Times are seconds with 3 decimals; unknown speakers are written
    as ``unknown``.
    """
    fid = re.sub(r"\s+", "_", file_id.strip()) or "audio"
    lines = []
    spans = t.turns if t.turns is not None else t.segments
    for s in spans:
        dur = round(s.end, 3) - round(s.start, 3)
        if dur <= 0:
            continue
        spk = re.sub(r"\s+", "_", t.display(s.speaker)) if s.speaker else UNKNOWN_SPEAKER
        lines.append(f"SPEAKER {fid} 1 {s.start:.3f} {dur:.3f} <NA> <NA> {spk} <NA> <NA>\n")
    return "".join(lines)


def _seek(s: Segment) -> int:
    # Whisper's seek is the 10 ms mel-frame offset of the decoding window; we report the
    # segment start in those units since our windows are not per-segment.
    return int(s.start * 100)


def _scores(w: DecodeWindow | None) -> dict:
    """verbose_json's four per-segment scores from the segment's decode window (see :func:`to_verbose_json`)."""
    if w is None:
        return {"temperature": 0.0, "avg_logprob": None, "compression_ratio": None, "no_speech_prob": None}
    return {"temperature": w.temperature if w.temperature is not None else 0.0, "avg_logprob": w.avg_logprob,
            "compression_ratio": w.compression_ratio, "no_speech_prob": w.no_speech_prob}


TIMESTAMP_GRANULARITIES = ("word", "segment")
"""OpenAI ``timestamp_granularities[]`` values: ``words`` and ``segments`` of ``verbose_json``."""


def timestamp_granularities(values: list[str] | None, response_format: str,
                            family: str) -> tuple[str, ...] | None:
    """The ``timestamp_granularities[]`` of an OpenAI-compatible request, checked: ``None`` when none were
    sent, else the distinct values in :data:`TIMESTAMP_GRANULARITIES` order.

    As OpenAI's API: they shape ``verbose_json`` only, so any other ``response_format`` refuses them rather
    than ignore them; ``word`` needs a model family that times words (``engine.config.ModelFamily
    .word_timestamps``: not MOSS-TD).

    Raises:
        InvalidRequest: (422) ``invalid_request`` for an unknown value or another ``response_format``;
            ``unsupported_granularity`` for ``word`` on a ``family`` without word times.
    """
    if not values:
        return None
    from diarist.contract.errors import InvalidRequest
    from engine.config import FAMILIES

    bad = [v for v in values if v not in TIMESTAMP_GRANULARITIES]
    if bad:
        raise InvalidRequest(f"timestamp_granularities[]: {', '.join(map(repr, bad))} is not one of "
                             f"{', '.join(TIMESTAMP_GRANULARITIES)}")
    if response_format != "verbose_json":
        raise InvalidRequest(f"timestamp_granularities[] shapes response_format=verbose_json only, not "
                             f"{response_format!r}")
    fam = FAMILIES.get(family)
    if "word" in values and (fam is None or not fam.word_timestamps):
        raise InvalidRequest(f"the {family} model times segments, not words: ask for "
                             f"timestamp_granularities[]=segment", code="unsupported_granularity")
    return tuple(g for g in TIMESTAMP_GRANULARITIES if g in values)


def to_verbose_json(t: Transcript, granularities: tuple[str, ...] | None = None) -> str:
    """OpenAI ``verbose_json``: ``{task, language, duration, text, segments?, words?, usage}``.

    Segments carry OpenAI's fields ``id, seek, start, end, text, tokens, temperature,
    avg_logprob, compression_ratio, no_speech_prob`` plus our ``speaker`` (OpenAI has no
    speaker field here). The four scores are those of the decode window that wrote the segment
    (:mod:`diarist.decode_windows`), as OpenAI Whisper gives each segment its window's; a transcript
    without windows (MOSS-TD, which decodes greedily in one sequence, or one stored before windows were
    kept) has ``temperature`` 0.0 and the three others ``null`` (as vLLM does). We do not keep token
    ids, so ``tokens`` is ``[]``. ``language`` is our ISO code (OpenAI writes the English name), ``""``
    when unknown. ``granularities`` (:func:`timestamp_granularities`) picks the lists as OpenAI does:
    ``segments`` with ``segment``, ``words`` (every word) with ``word``; ``None``
    (none asked for): ``segments``, and ``words`` when every segment has word timestamps.
    :func:`completeness_fields` are added at the top level.
    """
    body: dict = {"task": t.task, "language": t.language or "", "duration": t.duration, "text": t.text}
    if granularities is None or "segment" in granularities:
        body["segments"] = [
            {"id": s.id, "seek": _seek(s), "start": s.start, "end": s.end, "text": s.text, "tokens": [],
             **_scores(window_of(t.windows, s.start, s.end, s.channel)), "speaker": t.display(s.speaker)}
            for s in t.segments
        ]
    if (granularities is not None and "word" in granularities) or (
            granularities is None and t.segments and all(s.words is not None for s in t.segments)):
        body["words"] = [{"word": w.word, "start": w.start, "end": w.end}
                         for s in t.segments for w in s.words or []]
    body["usage"] = {"type": "duration", "seconds": t.duration}
    body.update(completeness_fields(t))
    return json.dumps(body, ensure_ascii=False)


RANDOM_WEIGHTS = "random_weights"
"""Warning code of a transcript an engine on random weights (``load_format=dummy``) wrote: its text is noise."""


def completeness_fields(t: Transcript) -> dict:
    """Our extra fields in OpenAI JSON shapes: ``finish_reason`` (why decoding ended), ``incomplete`` (the
    transcript may miss speech) and ``incomplete_reason``, ``coverage`` (transcribed / detected speech,
    :mod:`diarist.completeness`), ``warnings`` ([{code, message, count}]; first a :data:`RANDOM_WEIGHTS` one
    when the engine ran random weights, so an OpenAI client, which knows no ``random_weights`` field, sees it
    too), and ``random_weights`` when true."""
    warnings = [w.model_dump() for w in t.warnings]
    extra = {}
    if t.random_weights:
        warnings.insert(0, ResultWarning(code=RANDOM_WEIGHTS, message="the engine runs random weights "
                                         "(load_format=dummy): this transcript is noise, not the recording's "
                                         "speech").model_dump())
        extra["random_weights"] = True
    return {"finish_reason": t.finish_reason, "incomplete": t.incomplete, "incomplete_reason": t.incomplete_reason,
            "coverage": t.coverage, "warnings": warnings, **extra}


def completeness_headers(t: Transcript) -> dict[str, str]:
    """The same facts as HTTP headers, for shapes that are not JSON: ``X-Diarist-Finish-Reason``,
    ``X-Diarist-Incomplete`` (``true``/``false``), ``X-Diarist-Coverage`` (absent when unknown),
    ``X-Diarist-Random-Weights: true`` (the engine ran random weights; absent otherwise)."""
    h = {"X-Diarist-Finish-Reason": t.finish_reason, "X-Diarist-Incomplete": "true" if t.incomplete else "false"}
    if t.coverage is not None:
        h["X-Diarist-Coverage"] = f"{t.coverage:.4f}"
    if t.random_weights:
        h["X-Diarist-Random-Weights"] = "true"
    return h


def to_openai_json(t: Transcript) -> str:
    """OpenAI ``json``: ``{text, usage: {type: "duration", seconds}}`` plus :func:`completeness_fields`."""
    return json.dumps({"text": t.text, "usage": {"type": "duration", "seconds": t.duration},
                       **completeness_fields(t)}, ensure_ascii=False)


def openai_done_event(t: Transcript) -> dict:
    """The stream's final event: ``{type: "transcript.text.done", text}`` plus :func:`completeness_fields`."""
    return {"type": "transcript.text.done", "text": t.text, **completeness_fields(t)}


def to_diarized_json(t: Transcript) -> str:
    """OpenAI ``diarized_json``: ``{task, duration, text, segments, usage}``.

    Each segment is ``{type: "transcript.text.segment", id: "seg_<n>", start, end,
    speaker, text}``; our labels (``S01``...) replace OpenAI's ``A``, ``B``...; unknown
    speakers are ``unknown``. ``usage`` is ``{type: "duration", seconds}``. :func:`completeness_fields`
    are added at the top level.
    """
    body = {
        "task": "transcribe",
        "duration": t.duration,
        "text": t.text,
        "segments": [
            {"type": "transcript.text.segment", "id": f"seg_{s.id}", "start": s.start, "end": s.end,
             "speaker": t.display(s.speaker) or UNKNOWN_SPEAKER, "text": s.text}
            for s in t.segments
        ],
        "usage": {"type": "duration", "seconds": t.duration},
        **completeness_fields(t),
    }
    return json.dumps(body, ensure_ascii=False)


_FORMATS: dict[str, tuple[Callable[[Transcript], str], str]] = {
    "json": (to_json, "application/json"),
    "txt": (to_txt, "text/plain; charset=utf-8"),
    "text": (to_text, "text/plain; charset=utf-8"),
    "srt": (to_srt, "application/x-subrip; charset=utf-8"),
    "vtt": (to_vtt, "text/vtt; charset=utf-8"),
    "rttm": (to_rttm, "text/plain; charset=utf-8"),
    "verbose_json": (to_verbose_json, "application/json"),
    "diarized_json": (to_diarized_json, "application/json"),
    "svg": (to_svg, "image/svg+xml; charset=utf-8"),
}
SUPPORTED_FORMATS: tuple[str, ...] = tuple(_FORMATS)
MEDIA_TYPES: dict[str, str] = {fmt: media_type for fmt, (_fn, media_type) in _FORMATS.items()}
"""The media type (``Content-Type``) :func:`render` gives each format."""
"""Every ``render`` format: the one list that the API's ``format`` parameter, the dashboard's download route
and ``diarist transcribe --format`` accept."""


def render(transcript: Transcript, fmt: str, *, file_id: str | None = None) -> tuple[str, str]:
    """Render ``transcript`` as ``fmt``; returns ``(body, media_type)``.

    ``fmt`` is one of :data:`SUPPORTED_FORMATS` (case-insensitive). ``file_id`` names
    the recording in RTTM (default ``audio``). Raises ``ValueError`` naming the
    supported formats when ``fmt`` is unknown.
    """
    key = (fmt or "").strip().lower()
    if key not in _FORMATS:
        raise ValueError(f"unsupported format {fmt!r}; supported formats: {', '.join(SUPPORTED_FORMATS)}")
    fn, media_type = _FORMATS[key]
    if key == "rttm" and file_id:
        return to_rttm(transcript, file_id), media_type
    return fn(transcript), media_type


OPENAI_FORMATS: tuple[str, ...] = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
"""``response_format`` values of the OpenAI-compatible route."""


def render_openai(transcript: Transcript, fmt: str,
                  granularities: tuple[str, ...] | None = None) -> tuple[str, str, dict[str, str]]:
    """Render for the OpenAI-compatible route; returns ``(body, media_type, headers)``.

    ``fmt`` is one of :data:`OPENAI_FORMATS`; ``json`` is OpenAI's (:func:`to_openai_json`),
    ``verbose_json`` has the ``granularities`` asked for (:func:`to_verbose_json`), the others are
    :func:`render`'s. ``headers`` are :func:`completeness_headers` (sent with every shape). Raises
    ``ValueError`` for another ``fmt``.
    """
    if fmt not in OPENAI_FORMATS:
        raise ValueError(f"unsupported response_format {fmt!r}; supported: {', '.join(OPENAI_FORMATS)}")
    if fmt == "json":
        body, media_type = to_openai_json(transcript), "application/json"
    elif fmt == "verbose_json":
        body, media_type = to_verbose_json(transcript, granularities), "application/json"
    else:
        body, media_type = render(transcript, fmt)
    return body, media_type, completeness_headers(transcript)
