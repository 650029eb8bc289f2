"""Parse MOSS-Transcribe-Diarize output text into speaker segments.

Format (docs/moss_td.md §3, from the OpenMOSS README): segments
``[start][Sxx]text[end]`` concatenated with no separator, times in seconds as
decimals, speakers ``S01``, ``S02``... Example::

    [0.52][S01]Morning, shall we start?[2.31][2.90][S02]Yes.[5.04]

The model's output is not always well formed, so the parser never raises and
resolves each bracket by what follows it:

- ``[number]`` + optional whitespace + ``[Sxx]`` is a segment header (start, speaker);
- ``[number]`` followed by plain text is part of the text (``第[2024]年``) inside an open segment; where a
  segment may start (before the first one, or after an end time) it is a header without a speaker tag,
  and the segment gets :data:`DEFAULT_SPEAKER` (``[0.0]hello[1.0]`` -> S01), as the official parser does;
- ``[number]`` followed by another bracket or the end of the output ends the open
  segment, if it is not before that segment's start (otherwise it is dropped);
- ``[Sxx]`` with no time before it starts a segment at the last known time;
- any other bracket (``[laugh]``, ``[1.2.3]``) is text;
- text before the first header is ignored; text after a segment's end and before the
  next header (stray output) is appended to that segment;
- an unterminated bracket at the very end that looks like a cut-off time or speaker
  tag (``[12.``, ``[S0``) is dropped as a truncated tail; a segment whose end never
  came gets ``end=None``;
- segments whose text is empty after stripping are dropped.

Speaker tags are normalised to ``S`` + at least two digits (``[S1]`` -> ``S01``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_NUMBER = re.compile(r"\d+(?:\.\d*)?")
_SPEAKER = re.compile(r"[Ss](\d+)")
_PARTIAL_TAIL = re.compile(r"\s*(?:\d+(?:\.\d*)?|[Ss]\d*)?\s*")
_MAX_NUMBER_CHARS = 32  # a longer "time" is garbage, not a timestamp
DEFAULT_SPEAKER = "S01"  # a segment whose speaker tag is missing (the official parser's default_speaker)

# token kinds
_TEXT, _TAG, _NUM, _SPK = "text", "tag", "num", "spk"


def _tokenize(s: str) -> tuple[list[tuple[str, Any, str]], str]:
    """Split ``s`` into (kind, value, raw) tokens, adjacent plain text merged; and the cut-off tag dropped
    from the end (``""`` when none)."""
    out: list[tuple[str, Any, str]] = []

    def text(raw: str) -> None:
        if out and out[-1][0] == _TEXT:
            out[-1] = (_TEXT, None, out[-1][2] + raw)
        else:
            out.append((_TEXT, None, raw))

    i, n = 0, len(s)
    while i < n:
        if s[i] != "[":
            j = s.find("[", i)
            j = n if j < 0 else j
            text(s[i:j])
            i = j
            continue
        close, reopen = s.find("]", i + 1), s.find("[", i + 1)
        if close < 0 or 0 <= reopen < close:
            if close < 0 and reopen < 0 and _PARTIAL_TAIL.fullmatch(s[i + 1:]):
                return out, s[i:]  # output cut off inside a time or speaker tag
            text("[")
            i += 1
            continue
        inner, raw = s[i + 1:close].strip(), s[i:close + 1]
        if len(inner) <= _MAX_NUMBER_CHARS and _NUMBER.fullmatch(inner):
            out.append((_NUM, float(inner), raw))
        elif m := _SPEAKER.fullmatch(inner):
            out.append((_SPK, f"S{int(m.group(1)):02d}", raw))
        else:
            out.append((_TAG, None, raw))
        i = close + 1
    return out, ""


def _next_significant(tokens: list, k: int) -> int:
    """Index of the first token at or after ``k`` that is not whitespace-only text."""
    while k < len(tokens) and tokens[k][0] == _TEXT and not tokens[k][2].strip():
        k += 1
    return k


@dataclass
class MossParse:
    """Segments parsed from one output, and what was malformed in it.

    ``issues``: human-readable notes on what the parser had to repair or could not place (a last segment
    with no end time, a cut-off tag at the end, text after the last end time, text before the first
    header); empty for well-formed output. A transcript with issues is marked ``incomplete``
    (``transcription.transcriber``) with the first issue as its reason.
    """

    segments: list[dict[str, Any]] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)


def _snippet(s: str) -> str:
    s = " ".join(s.split())
    return s if len(s) <= 40 else s[:37] + "..."


def parse_moss_td_report(text: str) -> MossParse:
    """:func:`parse_moss_td` with the notes on malformed output (:class:`MossParse`). Never raises."""
    return _parse(text, 0.0)[0]


def _parse(text: str, base_time: float) -> tuple[MossParse, list[tuple[int, float]], list[int]]:
    """The parse of ``text``, the ``(char offset, time before it)`` of every segment header, and the header
    offset of each returned segment. ``base_time``: the time a speaker tag without a time starts at when
    no segment precedes it (the previous segment's, when ``text`` resumes a longer output)."""
    tokens, cut = _tokenize(text)
    out = MossParse()
    segments = out.segments
    cur: dict[str, Any] | None = None
    leading: list[str] = []
    stray = False
    headers: list[tuple[int, float]] = []
    seg_at: list[int] = []
    at = 0  # char offset of the current token

    def close() -> None:
        if cur is not None:
            body = "".join(cur.pop("parts")).strip()
            if body:
                cur["text"] = body
                seg_at.append(cur.pop("at"))
                segments.append(cur)

    def last_time() -> float:
        if cur is None:
            return base_time
        return cur["end"] if cur["end"] is not None else cur["start"]

    k = 0
    while k < len(tokens):
        kind, value, raw = tokens[k]
        if kind in (_NUM, _SPK):
            nxt = _next_significant(tokens, k + 1) if kind == _NUM else k
            nkind = tokens[nxt][0] if nxt < len(tokens) else None
            if kind == _SPK or nkind == _SPK or (nkind == _TEXT and (cur is None or cur["end"] is not None)):
                headers.append((at, last_time()))
        if kind == _NUM:
            nxt = _next_significant(tokens, k + 1)
            nkind = tokens[nxt][0] if nxt < len(tokens) else None
            if nkind == _SPK:  # header: [start] [Sxx]
                close()
                cur = {"speaker": tokens[nxt][1], "start": value, "end": None, "parts": [], "at": at}
                stray = False
                at += sum(len(t[2]) for t in tokens[k:nxt + 1])
                k = nxt + 1
                continue
            if nkind == _TEXT and (cur is None or cur["end"] is not None):  # header without a speaker tag
                close()
                cur = {"speaker": DEFAULT_SPEAKER, "start": value, "end": None, "parts": [], "at": at}
                stray = False
                at += len(raw)
                k += 1
                continue
            if nkind == _TEXT:  # a number inside the text
                cur["parts"].append(raw)
            elif cur is not None and cur["end"] is None and value >= cur["start"]:
                cur["end"] = value
            at += len(raw)
            k += 1
            continue
        if kind == _SPK:  # header without a start time
            start = last_time()
            close()
            cur = {"speaker": value, "start": start, "end": None, "parts": [], "at": at}
            stray = False
        elif cur is not None:
            stray = stray or (cur["end"] is not None and bool(raw.strip()))
            cur["parts"].append(raw)
        else:
            leading.append(raw)
        at += len(raw)
        k += 1
    tail = cur
    close()
    if "".join(leading).strip():
        out.issues.append(f"text before the first segment header was ignored: {_snippet(''.join(leading))!r}")
    if cut:
        out.issues.append(f"the output ends inside a cut-off time or speaker tag {_snippet(cut)!r}")
    if tail is not None and tail["end"] is None and tail in segments:
        out.issues.append(f"the last segment (from {tail['start']:.2f} s) has no end time")
    elif stray:
        out.issues.append("text after the last segment's end time was kept in that segment")
    return out, headers, seg_at


def parse_moss_td(text: str) -> list[dict[str, Any]]:
    """Parse MOSS-TD output into ``[{"speaker": "S01", "start": s, "end": s | None, "text": str}]``.

    ``text`` is the decoded output (special tokens removed). Times are seconds as
    written by the model (absolute over the recording). ``end`` is ``None`` for a
    segment whose end timestamp is missing (e.g. a truncated decode). Never raises
    for any ``str`` input; the rules for malformed output are in the module docstring,
    and :func:`parse_moss_td_report` also says what was malformed.
    """
    return parse_moss_td_report(text).segments


class MossStreamParser:
    """Parse-as-you-go: feed the decoded output as it grows; segments come out as soon as they are final,
    and :meth:`close` gives exactly :func:`parse_moss_td_report` of the whole output.

    A segment is final once the next segment's header has been read and decided: a header decision looks
    ahead only to the next significant token, and only the output's last token can still change (an
    unclosed ``[`` may become a tag, trailing whitespace may become text), so headers are taken from the
    output without its last token. Only the text from the last header on is parsed again on each feed, with
    the time before that header as context: the cost per feed is the open segment's length, not the
    output's.
    """

    def __init__(self) -> None:
        self.text = ""
        self._offset = 0  # start of the open tail (the last header) in ``text``
        self._base = 0.0  # the time before that header
        self._final: list[dict[str, Any]] = []
        self._leading: list[str] = []  # the note on ignored leading text, kept once its text is committed

    @property
    def final(self) -> list[dict[str, Any]]:
        """Segments final so far (copies)."""
        return [dict(x) for x in self._final]

    def feed(self, chunk: str) -> list[dict[str, Any]]:
        """Append ``chunk`` (decoded text, any split); returns the segments that became final (copies)."""
        self.text += chunk
        tail = self.text[self._offset:]
        tokens, cut = _tokenize(tail)
        # The last token can still change kind ("[l" -> "[laugh]", " " -> " x") and with it the decision of
        # the header before it; everything before it is final. Headers are taken from that part only.
        stable = len(tail) - len(cut) - (len(tokens[-1][2]) if tokens else 0)
        parsed, headers, seg_at = _parse(tail[:stable], self._base)
        if len(headers) < 2 and not (headers and headers[-1][0] > 0):
            return []
        last, base = headers[-1]
        new = [dict(x) for x, at in zip(parsed.segments, seg_at, strict=True) if at < last]
        if self._offset == 0:
            self._leading = [i for i in parsed.issues if i.startswith("text before the first")]
        self._offset += last
        self._base = base
        self._final.extend(new)
        return [dict(x) for x in new]

    def open_segments(self) -> list[dict[str, Any]]:
        """The final segments followed by the open tail's, as a parse of the output so far would give."""
        return self._final + _parse(self.text[self._offset:], self._base)[0].segments

    def close(self) -> MossParse:
        """The whole output's parse (equal to ``parse_moss_td_report(self.text)``)."""
        tail = _parse(self.text[self._offset:], self._base)[0]
        issues = list(self._leading) if self._offset else []
        return MossParse(segments=self.final + tail.segments, issues=issues + tail.issues)


def render_moss_td(segments: list[dict[str, Any]]) -> str:
    """Render segments in MOSS-TD's canonical form (times with 2 decimals); inverse of the parser
    for well-formed input. Used by tests and to build few-shot/fake model outputs."""
    out = []
    for s in segments:
        end = "" if s.get("end") is None else f"[{s['end']:.2f}]"
        out.append(f"[{s['start']:.2f}][{s['speaker']}]{s['text']}{end}")
    return "".join(out)
