"""Who spoke when: a transcript as speaker lanes on a time axis, and its SVG picture.

:class:`SpeakerTimeline` is the one place that decides the lanes (one per speaker, in the transcript's
order of first appearance, then ``unknown`` for segments without a speaker), what each lane is called (the
speaker's name when the transcript knows it, else its label), its colour, the bars (one per segment, with
its text) and the overlaps (spans where two or more speakers talk at once: from the diarization's turns when
the transcript has them, else from the segments). The API's ``format=svg`` export draws it with
:func:`to_svg`; the dashboard's job page draws the same :meth:`SpeakerTimeline.to_json` in the browser
(zoomable, a bar's text on click).

Times are seconds. Nothing here imports torch or the engine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from xml.sax.saxutils import escape

from diarist.transcript import UNKNOWN_SPEAKER, Transcript

PALETTE = ("#2f6fdf", "#d1602a", "#1f9d63", "#8e44c9", "#c08a00", "#14919b", "#d03a74", "#5b6b7c")
"""Lane colours, in lane order (repeating after eight speakers)."""
UNKNOWN_COLOR = "#9aa5b1"
"""The colour of the lane of segments without a speaker."""
OVERLAP_COLOR = "#e5484d"
"""The colour of the overlap strip."""
TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
"""Candidate spacings of the time axis's ticks (seconds); the dashboard's script uses the same."""


@dataclass(frozen=True)
class Lane:
    """One speaker's lane: ``speaker`` is the transcript's label (``S01``; ``None`` for unknown), ``name``
    what the lane is called (the speaker's name when known, else the label), ``color`` a CSS colour."""

    speaker: str | None
    name: str
    color: str


@dataclass(frozen=True)
class Bar:
    """A span on lane ``lane`` (an index into :attr:`SpeakerTimeline.lanes`) from ``start`` to ``end``
    seconds; ``text`` is the segment's text (empty for a diarization turn)."""

    lane: int
    start: float
    end: float
    text: str = ""


@dataclass(frozen=True)
class SpeakerTimeline:
    """The picture's content: ``duration`` (s), ``lanes``, ``bars`` (one per segment, time order), ``turns``
    (the diarization's turns, may overlap; empty when the transcript has none) and ``overlaps``
    (``(start, end)`` seconds where two or more lanes are active at once)."""

    duration: float
    lanes: tuple[Lane, ...]
    bars: tuple[Bar, ...]
    turns: tuple[Bar, ...]
    overlaps: tuple[tuple[float, float], ...]

    @classmethod
    def of(cls, t: Transcript) -> SpeakerTimeline:
        """The timeline of transcript ``t``."""
        labels = list(t.speakers)
        for s in t.segments:  # a label the speakers list misses still gets its lane
            if s.speaker is not None and s.speaker not in labels:
                labels.append(s.speaker)
        lanes = [Lane(label, speaker_name(t, label) or label, PALETTE[i % len(PALETTE)])
                 for i, label in enumerate(labels)]
        index = {label: i for i, label in enumerate(labels)}
        if any(s.speaker is None for s in t.segments):
            index[None] = len(lanes)
            lanes.append(Lane(None, UNKNOWN_SPEAKER, UNKNOWN_COLOR))
        bars = tuple(Bar(index[s.speaker], s.start, s.end, s.text) for s in t.segments)
        turns = tuple(Bar(index[u.speaker], u.start, u.end) for u in t.turns or () if u.speaker in index)
        duration = max([t.duration, *(b.end for b in bars), *(b.end for b in turns)])
        return cls(duration, tuple(lanes), bars, turns, overlaps(turns or bars))

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict: ``duration``, ``lanes`` [{speaker, name, color}], ``bars`` and ``turns``
        [[lane, start, end], ...] (compact: a 90-minute meeting has thousands), ``texts`` (the bars'
        texts, same order), ``overlaps`` [[start, end], ...], ``tick_steps`` (:data:`TICK_STEPS_S`)."""
        return {"duration": self.duration, "lanes": [asdict(lane) for lane in self.lanes],
                "bars": [[b.lane, b.start, b.end] for b in self.bars], "texts": [b.text for b in self.bars],
                "turns": [[b.lane, b.start, b.end] for b in self.turns],
                "overlaps": [list(o) for o in self.overlaps], "tick_steps": list(TICK_STEPS_S)}


def speaker_name(t: Transcript, label: str) -> str | None:
    """The name of speaker ``label`` when the transcript knows it: an identity's ``name`` (known speakers
    matched to voice profiles or named by the caller, on transcripts that carry ``identities``), else the
    source's own name for it (``speaker_names``, e.g. a channel label); ``None`` when it has none."""
    identity = (getattr(t, "identities", None) or {}).get(label)
    return getattr(identity, "name", None) or (t.speaker_names or {}).get(label)


def overlaps(spans: Iterable[Bar]) -> tuple[tuple[float, float], ...]:
    """Where two or more lanes are active at once: ``(start, end)`` seconds, in time order, merged.

    A sweep over the spans' edges (an end at the same time as a start closes first, so back-to-back turns
    are not an overlap). Two spans of the same lane overlapping each other do not count.
    """
    edges = sorted((t, kind, b.lane) for b in spans if b.end > b.start for t, kind in ((b.start, 1), (b.end, -1)))
    active: dict[int, int] = {}
    out: list[list[float]] = []
    since: float | None = None
    for t, kind, lane in edges:
        active[lane] = active.get(lane, 0) + kind
        if not active[lane]:
            del active[lane]
        if len(active) >= 2 and since is None:
            since = t
        elif len(active) < 2 and since is not None:
            if t > since:
                if out and out[-1][1] >= since:
                    out[-1][1] = t
                else:
                    out.append([since, t])
            since = None
    return tuple((a, b) for a, b in out)


def clock(seconds: float, decimals: int = 0) -> str:
    """``mm:ss`` of a time in seconds (``h:mm:ss`` from an hour on), with ``decimals`` digits of the second
    (truncated, as a clock shows them: ``clock(5.46, 1) == "00:05.4"``)."""
    s = math.floor(max(0.0, float(seconds)) * 10**decimals + 1e-9) / 10**decimals  # 0.29 * 100 < 29
    h, m, sec = int(s // 3600), int(s % 3600 // 60), s % 60
    width = 2 + (decimals + 1 if decimals else 0)
    text = f"{sec:0{width}.{decimals}f}"
    return f"{h}:{m:02d}:{text}" if h else f"{m:02d}:{text}"


def tick_step(span_s: float, max_ticks: int = 12, steps: Sequence[int] = TICK_STEPS_S) -> int:
    """The smallest of ``steps`` (seconds) that puts at most ``max_ticks`` ticks on ``span_s`` seconds."""
    return next((s for s in steps if span_s / s <= max_ticks), steps[-1] * math.ceil(span_s / steps[-1] / max_ticks))


# Layout of the SVG (px)
WIDTH, LABEL_W, RIGHT, TOP, LANE_H, BAR_H, STRIP_H, AXIS_H = 1200, 160, 40, 30, 28, 18, 10, 26


def to_svg(t: Transcript) -> str:
    """The speaker timeline of ``t`` as a standalone SVG 1.1 document (UTF-8 text, ``image/svg+xml``).

    One lane per speaker (name, else label, on the left), each segment a bar in its speaker's colour with
    its time and text as a tooltip (``<title>``), the diarization's turns as a pale band behind the bars,
    the overlaps as a red strip under the lanes, and a time axis (``mm:ss``). 1200 px wide; the height
    grows with the number of speakers. All text is XML-escaped.
    """
    tl = SpeakerTimeline.of(t)
    plot_w = WIDTH - LABEL_W - RIGHT
    scale = plot_w / tl.duration if tl.duration > 0 else 0.0
    lanes_h = max(1, len(tl.lanes)) * LANE_H
    strip_y = TOP + lanes_h + 4
    axis_y = strip_y + STRIP_H + 4
    height = axis_y + AXIS_H

    def x(sec: float) -> float:
        return LABEL_W + sec * scale

    def rect(b: Bar, y: float, h: float, fill: str, extra: str = "") -> str:
        w = max((b.end - b.start) * scale, 1.0)  # a short segment stays visible on a long recording
        return f'<rect x="{x(b.start):.2f}" y="{y:.1f}" width="{w:.2f}" height="{h}" fill="{fill}"{extra}'

    speakers = sum(lane.speaker is not None for lane in tl.lanes)
    summary = f"{speakers} speaker{'s' * (speakers != 1)}, {len(tl.bars)} segments, {clock(tl.duration)}"
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="system-ui, sans-serif" font-size="12">'),
           f"<title>Speaker timeline: {summary}</title>",
           f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
           f'<text x="{LABEL_W}" y="18" fill="#3e4c59" font-weight="600">Who spoke when ({summary})</text>']
    for i, lane in enumerate(tl.lanes):
        y = TOP + i * LANE_H
        out.append(f'<rect x="{LABEL_W}" y="{y}" width="{plot_w}" height="{LANE_H}" '
                   f'fill="{"#f7f8fa" if i % 2 == 0 else "#ffffff"}"/>')
        out.append(f'<text x="{LABEL_W - 8}" y="{y + LANE_H / 2 + 4:.1f}" text-anchor="end" fill="{lane.color}" '
                   f'font-weight="600">{escape(_fit(lane.name))}</text>')
    pad = (LANE_H - BAR_H) / 2
    for b in tl.turns:
        out.append(rect(b, TOP + b.lane * LANE_H + 2, LANE_H - 4, tl.lanes[b.lane].color, ' fill-opacity="0.18"/>'))
    for b in tl.bars:
        lane = tl.lanes[b.lane]
        tip = f"{lane.name} {clock(b.start, 1)}–{clock(b.end, 1)}: {b.text}"
        out.append(rect(b, TOP + b.lane * LANE_H + pad, BAR_H, lane.color,
                        f' fill-opacity="0.85"><title>{escape(tip)}</title></rect>'))
    out.append(f'<text x="{LABEL_W - 8}" y="{strip_y + STRIP_H - 1}" text-anchor="end" fill="{OVERLAP_COLOR}">'
               "overlap</text>")
    out.append(f'<rect x="{LABEL_W}" y="{strip_y}" width="{plot_w}" height="{STRIP_H}" fill="#f7f8fa"/>')
    for a, b in tl.overlaps:
        out.append(rect(Bar(0, a, b), strip_y, STRIP_H, OVERLAP_COLOR,
                        f"><title>{escape(f'overlap {clock(a)}–{clock(b)}')}</title></rect>"))
    out.append(f'<line x1="{LABEL_W}" y1="{axis_y}" x2="{LABEL_W + plot_w}" y2="{axis_y}" stroke="#9aa5b1"/>')
    step = tick_step(tl.duration)
    for k in range(int(tl.duration // step) + 1):
        tx = x(k * step)
        out.append(f'<line x1="{tx:.2f}" y1="{axis_y}" x2="{tx:.2f}" y2="{axis_y + 5}" stroke="#9aa5b1"/>'
                   f'<text x="{tx:.2f}" y="{axis_y + 18}" text-anchor="middle" fill="#6b7785">'
                   f"{clock(k * step)}</text>")
    if not tl.bars:
        out.append(f'<text x="{LABEL_W + plot_w / 2}" y="{TOP + LANE_H / 2 + 4}" text-anchor="middle" '
                   'fill="#6b7785">No speech</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _fit(name: str, limit: int = 22) -> str:
    """A lane name short enough for the label column."""
    return name if len(name) <= limit else name[: limit - 1] + "…"

