"""Parse MOSS-Transcribe-Diarize output text into speaker segments.

Format (docs/moss_td.md §3, from the OpenMOSS README): segments
``[start][Sxx]text[end]`` concatenated with no separator, times in seconds as
decimals, speakers ``S01``, ``S02``... Example::

    [0.52][S01]Morning, shall we start?[2.31][2.90][S02]Yes.[5.04]

The model's output is not always well formed, so the parser never raises and
resolves each bracket by what follows it:

- ``[number]`` + optional whitespace + ``[Sxx]`` is a segment header (start, speaker);
- ``[number]`` followed by plain text is part of the text (``第[2024]年``);
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
from typing import Any

_NUMBER = re.compile(r"\d+(?:\.\d*)?")
_SPEAKER = re.compile(r"[Ss](\d+)")
_PARTIAL_TAIL = re.compile(r"\s*(?:\d+(?:\.\d*)?|[Ss]\d*)?\s*")
_MAX_NUMBER_CHARS = 32  # a longer "time" is garbage, not a timestamp

# token kinds
_TEXT, _TAG, _NUM, _SPK = "text", "tag", "num", "spk"


def _tokenize(s: str) -> list[tuple[str, Any, str]]:
    """Split ``s`` into (kind, value, raw) tokens; adjacent plain text is merged."""
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
                break  # output cut off inside a time or speaker tag
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
    return out


def _next_significant(tokens: list, k: int) -> int:
    """Index of the first token at or after ``k`` that is not whitespace-only text."""
    while k < len(tokens) and tokens[k][0] == _TEXT and not tokens[k][2].strip():
        k += 1
    return k


def parse_moss_td(text: str) -> list[dict[str, Any]]:
    """Parse MOSS-TD output into ``[{"speaker": "S01", "start": s, "end": s | None, "text": str}]``.

    ``text`` is the decoded output (special tokens removed). Times are seconds as
    written by the model (absolute over the recording). ``end`` is ``None`` for a
    segment whose end timestamp is missing (e.g. a truncated decode). Never raises
    for any ``str`` input; the rules for malformed output are in the module docstring.
    """
    tokens = _tokenize(text)
    segments: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None

    def close() -> None:
        if cur is not None:
            body = "".join(cur.pop("parts")).strip()
            if body:
                cur["text"] = body
                segments.append(cur)

    def last_time() -> float:
        if cur is None:
            return 0.0
        return cur["end"] if cur["end"] is not None else cur["start"]

    k = 0
    while k < len(tokens):
        kind, value, raw = tokens[k]
        if kind == _NUM:
            nxt = _next_significant(tokens, k + 1)
            nkind = tokens[nxt][0] if nxt < len(tokens) else None
            if nkind == _SPK:  # header: [start] [Sxx]
                close()
                cur = {"speaker": tokens[nxt][1], "start": value, "end": None, "parts": []}
                k = nxt + 1
                continue
            if nkind == _TEXT:  # a number inside the text
                if cur is not None:
                    cur["parts"].append(raw)
            elif cur is not None and cur["end"] is None and value >= cur["start"]:
                cur["end"] = value
            k += 1
            continue
        if kind == _SPK:  # header without a start time
            start = last_time()
            close()
            cur = {"speaker": value, "start": start, "end": None, "parts": []}
        elif cur is not None:
            cur["parts"].append(raw)
        k += 1
    close()
    return segments


def render_moss_td(segments: list[dict[str, Any]]) -> str:
    """Render segments in MOSS-TD's canonical form (times with 2 decimals); inverse of the parser
    for well-formed input. Used by tests and to build few-shot/fake model outputs."""
    out = []
    for s in segments:
        end = "" if s.get("end") is None else f"[{s['end']:.2f}]"
        out.append(f"[{s['start']:.2f}][{s['speaker']}]{s['text']}{end}")
    return "".join(out)
