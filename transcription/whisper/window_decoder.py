"""Decode a recording's Whisper windows so that no speech is silently lost: fallback, resume, seams.

The windows of a recording (``transcription.whisper.windows.pack_windows``: speech packed into spans of at most
30 s, cut at silences between VAD regions) decode together in the engine's batch. Three rules keep every
word, and each choice is the one that keeps windows that start at a silence independent (batched):

1. **Temperature fallback** (``transcription.decode_quality``): an attempt that fails (loop guard, budget,
   compression ratio, mean log-probability) is decoded again at the next of 0.2, 0.4, ... 1.0 with a fixed
   seed, and the first attempt that passes is kept, else the best one.
2. **Resume after a loop**: when even the best attempt looped, the text up to its last complete segment
   before the loop is kept and the rest of the window is decoded again as a new window starting at that
   segment's end (the whole fallback ladder again, at most :data:`MAX_RESUMES` times in a row). Greedy
   decoding resumed from the same tokens would repeat the same loop; a new window on the remaining audio
   does not see the looping text at all.
3. **Seams**: a window that ends inside speech (a VAD region longer than 30 s: a hard cut) keeps only
   its complete segments that end at least :data:`SEAM_MARGIN_S` before the cut; the next window starts
   where the last kept segment ends and is planned again from the speech left (``pack_windows``), so the
   words around a cut are decoded once, whole, by the next window (OpenAI Whisper's seek to the last
   timestamp, made unconditional, since tiny.en may close a segment and stop before words cut at 30 s).
   Windows after a hard cut therefore wait for the one before; windows after a silence do not.
4. **Dropped tails**: a window whose last segment closes with more than :data:`TAIL_SPEECH_S` of the VAD's
   speech still after it (tiny.en sometimes writes end-of-text early) has that rest decoded again as a new
   window, from where its words end: a closing timestamp may come before words the text already holds
   (base closes meeting speech early), and decoding again from the timestamp wrote those words twice. The
   words' end comes from the alignment heads (``words_end``); without them, from the segment's end.

A window whose attempts all fail is kept (its best text), flagged (:data:`decode_quality.LOOP`,
:data:`decode_quality.REPETITIVE`, :data:`decode_quality.LOW_CONFIDENCE`) and makes the transcript
incomplete (``window_outcome``), as :data:`decode_quality.TRUNCATED` does (a window stopped at its token
budget in text that does not repeat: kept, never decoded again, since another attempt stops at the same
limit). A window the model takes as silence (``AttemptQuality.silence``) keeps no text.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.engine import Engine
from engine.request import FinishReason, Sequence
from engine.sampling import SamplingParams
from transcription.decode_quality import FALLBACK_SEED, TEMPERATURES, AttemptQuality, assess
from transcription.errors import EngineError
from transcription.progress import EventFn
from transcription.repetition import RepetitionGuard
from transcription.whisper.decoding import TIME_PRECISION, WhisperTokens, split_segments
from transcription.whisper.windows import Window, pack_windows

SEAM_MARGIN_S = 1.0
"""At a hard cut, segments ending closer than this to the cut are decoded again by the next window."""

MIN_ADVANCE_S = 1.0
"""A seam or resume point must be at least this far into its window (otherwise the window is kept whole):
every re-plan moves forward, so decoding always ends."""

TAIL_SPEECH_S = 1.0
"""A window whose last segment closes with at least this much VAD speech still after it (seconds) had its
tail dropped by the decoder (it wrote end-of-text early); that speech is decoded again as a new window."""

MAX_RESUMES = 3
"""Resumes after a loop in a row before a window is given up (flagged) and the audio after it decoded."""

_EPS = 1e-6


@dataclass
class WindowResult:
    """The final decode of one window.

    Attributes:
        window: the audio decoded (absolute seconds); segment times are relative to ``window.start``.
        end: where the kept text ends (seconds, absolute): ``window.end``, or an earlier segment end when
            the rest was passed to a later window (a seam or a resume).
        seq: the attempt kept (its encoder output, if kept for alignment, is in ``seq.mm_state``).
        output_ids: the output tokens the transcript keeps.
        quality: that attempt's checks; ``attempts``: how many decodes the window took.
        status: ``ok``, ``no_speech`` (taken as silence, no text) or ``failed`` (every attempt failed).
        flag: ``decode_quality.LOOP`` / ``REPETITIVE`` / ``LOW_CONFIDENCE`` for a failed window,
            ``TRUNCATED`` for one whose text stopped at the token budget (failed or ok), else ``None``.
        segments: the transcript segments made from it (set by the decoder's ``finalize``); ``preview``: its
            segments without words (for the events sent while other windows still decode).
    """

    window: Window
    end: float
    seq: Sequence
    output_ids: list[int]
    quality: AttemptQuality
    attempts: int
    status: str
    flag: str | None = None
    segments: list[dict] = field(default_factory=list)
    preview: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        """A JSON-able account of the window (for ``result["windows"]``; seconds)."""
        return {"start": round(self.window.start, 3), "end": round(self.end, 3), "status": self.status,
                "flag": self.flag, "attempts": self.attempts, **self.quality.as_dict()}


@dataclass
class _Task:
    window: Window
    cut: bool  # speech runs on past window.end
    group_end: float  # re-plans of this run of windows stop here
    resumes: int
    attempts: list[tuple[Sequence, AttemptQuality]] = field(default_factory=list)
    seq: Sequence | None = None


class WindowDecoder:
    """Runs one recording's windows (one instance per recording and thread).

    Args:
        engine: the engine the sequences run on.
        tokens: the checkpoint's special ids.
        decode: token ids -> text (the tokenizer's).
        new_sequence: ``(window, sampling, cut) -> Sequence`` of one attempt (prompt, mel, rules, loop
            guard); ``cut``: the window ends inside speech.
        finalize: ``(WindowResult) -> segments`` (absolute times), called once per final window, in time
            order, after the last window decoded (so word alignment never delays noticing a cancel); it may
            use and drop the attempt's encoder output.
        speech: the VAD's speech regions (seconds), for seams and re-plans.
        vad_confidence: ``(start, end) -> float | None``, the VAD's mean speech probability over a span
            (``transcription.audio.vad.SpeechAnalysis.confidence``), for the silence rule; ``None``: unknown.
        word_cut: ``(seq, ids, window, limit_s) -> (kept ids, seconds) | None``: ``ids`` up to the last word
            that ends by ``limit_s`` seconds into the window, closed by a timestamp, and that word's end;
            used at a hard cut when no segment closes in time (one segment over the whole window).
            ``new_sequence`` gets ``cut=True`` for such windows so their attempts can keep what it needs.
        on_event: receives ``started``, then ``delta`` and ``segment`` events in time order; a window's text
            is sent once its decode is final (streamed text cannot be taken back after a fallback).
        words_end: ``(seq, ids, window) -> seconds | None``: where the last word of ``ids`` ends, seconds into
            the window (aligned), or ``None`` when unknown; asked only when a window closed its last segment
            with speech left (rule 4). ``keep_encoder``: whether ``finalize`` uses the kept attempt's encoder
            output; when not, it is dropped once the window's outcome is decided.
        temperatures: each attempt's sampling temperature, in turn
            (:func:`transcription.decode_quality.temperature_schedule` of the request's ``temperature``).
    """

    def __init__(self, engine: Engine, tokens: WhisperTokens, decode: Callable[[list[int]], str],
                 new_sequence: Callable[[Window, SamplingParams, bool], Sequence],
                 finalize: Callable[[WindowResult], list[dict]], speech: list[tuple[float, float]],
                 on_event: EventFn | None = None,
                 vad_confidence: Callable[[float, float], float | None] | None = None,
                 word_cut: Callable[[Sequence, list[int], Window, float], tuple[list[int], float] | None]
                 | None = None,
                 words_end: Callable[[Sequence, list[int], Window], float | None] | None = None,
                 temperatures: tuple[float, ...] = TEMPERATURES, keep_encoder: bool = True) -> None:
        self.engine = engine
        self.temperatures = temperatures
        self.t = tokens
        self.decode = decode
        self.new_sequence = new_sequence
        self.finalize = finalize
        self.speech = sorted((s, e) for s, e in speech if e > s)
        self.on_event = on_event
        self.vad_confidence = vad_confidence
        self.word_cut = word_cut
        self.words_end = words_end
        self.keep_encoder = keep_encoder
        self.active: dict[Sequence, _Task] = {}
        self.results: list[WindowResult] = []
        self.sequences: list[Sequence] = []  # every attempt, for the metrics
        self.canceled = False
        self._should_cancel: Callable[[], bool] | None = None
        self._emitted = 0
        self._lock = threading.Lock()
        self._started = False

    # -- public -------------------------------------------------------------------------------------
    def run(self, windows: list[Window], should_cancel: Callable[[], bool] | None = None) -> list[WindowResult]:
        """Decode ``windows`` (from ``pack_windows``) and what they lead to; results in time order.

        Once ``should_cancel()`` is True no attempt is submitted any more (first windows, fallbacks,
        re-plans) and every running one is aborted: a canceled recording's load on the engine only falls.

        Raises:
            EngineError: an attempt failed inside the engine (the recording's other sequences are aborted).
        """
        self._should_cancel = should_cancel
        for group in self._groups(windows):
            self._start(group, resumes=0)
        while self.active:
            done = self.engine.run_until_any_done(list(self.active), should_cancel=should_cancel)
            if any(s.finish_reason == FinishReason.ABORT for s in done):
                self.canceled = True
            failed = next((s for s in done if s.finish_reason == FinishReason.ERROR), None)
            if self.canceled or failed is not None:
                for s in self.active:
                    if not s.finished:
                        self.engine.abort(s)
                self.engine.run_until_done(list(self.active))
                if failed is not None and not self.canceled:
                    raise EngineError(failed.error or "engine step failed")
                for s in list(self.active):  # an aborted recording's unfinished windows give no text
                    task = self.active.pop(s)
                    s.mm_state.pop("encoder", None)
                    self.results.append(WindowResult(task.window, task.window.end, s, [], self._assess(s, task.window),
                                                     len(task.attempts) + 1, "ok"))
                break
            for seq in done:
                self._finished(self.active.pop(seq), seq)
            self._emit_ready()
        self.results.sort(key=lambda r: r.window.start)
        self._emit_ready(final=True)
        for r in self.results:
            r.segments = self.finalize(r)
        return self.results

    # -- planning -----------------------------------------------------------------------------------
    def _ends_in_speech(self, t: float) -> bool:
        return any(s < t - _EPS and e > t + _EPS for s, e in self.speech)

    def _groups(self, windows: list[Window]) -> list[list[Window]]:
        """Runs of windows joined by hard cuts: every window of a run but the last ends inside speech."""
        out: list[list[Window]] = []
        cur: list[Window] = []
        for w in windows:
            cur.append(w)
            if not self._ends_in_speech(w.end):
                out.append(cur)
                cur = []
        if cur:
            out.append(cur)
        return out

    def _start(self, group: list[Window], resumes: int) -> None:
        w = group[0]
        cut = len(group) > 1 and self._ends_in_speech(w.end)
        if not cut:  # no window of the group waits for another: all start now
            for x in group:
                self._submit(_Task(x, False, x.end, resumes), 0)
            return
        self._submit(_Task(w, True, group[-1].end, resumes), 0)

    def _replan(self, start: float, stop: float, resumes: int) -> None:
        """Decode the speech in ``[start, stop)`` again as new windows (after a seam or a resume)."""
        left = [(max(s, start), min(e, stop)) for s, e in self.speech if e > start + _EPS and s < stop - _EPS]
        for group in self._groups(pack_windows(left)):
            self._start(group, resumes)

    def _submit(self, task: _Task, attempt: int) -> None:
        if self.canceled or (self._should_cancel is not None and self._should_cancel()):
            self.canceled = True  # the window is dropped with the rest of the canceled recording
            return
        params = SamplingParams(temperature=self.temperatures[attempt], seed=FALLBACK_SEED, logprobs=True)
        seq = self.new_sequence(task.window, params, task.cut)
        seq.on_event = self._listener
        task.seq = seq
        self.active[seq] = task
        self.sequences.append(seq)
        self.engine.submit(seq)

    def _listener(self, seq: Sequence, kind: str, payload: object) -> None:
        if kind == "token" and not self._started:
            with self._lock:
                if not self._started:
                    self._started = True
                    if self.on_event is not None:
                        self.on_event("started", {})

    # -- a finished attempt ---------------------------------------------------------------------------
    def _assess(self, seq: Sequence, w: Window) -> AttemptQuality:
        conf = self.vad_confidence(w.start, w.end) if self.vad_confidence is not None else None
        return assess(seq, self.decode([t for t in seq.output_ids if t < self.t.eot]), conf)

    def _finished(self, task: _Task, seq: Sequence) -> None:
        q = self._assess(seq, task.window)
        task.attempts.append((seq, q))
        if q.failed and len(task.attempts) < len(self.temperatures):
            seq.mm_state.pop("encoder", None)  # a discarded attempt's encoder output is not needed
            self._submit(task, len(task.attempts))
            return
        best_seq, best_q = (seq, q) if not q.failed else max(task.attempts, key=lambda a: a[1].rank())
        for s, _ in task.attempts:
            if s is not best_seq:
                s.mm_state.pop("encoder", None)
        ids = _kept(best_seq)
        w = task.window
        if best_q.silence:
            self._accept(task, best_seq, best_q, [], "no_speech", None, w.end)
            return
        loop_at = getattr(best_seq.stop_checker, "loop_start", None)
        if best_q.looped and loop_at is not None and task.resumes < MAX_RESUMES:
            # the guard found where the loop starts: keep the segments before it, decode the rest again
            good, t_good = self._cut_at(best_seq.output_ids[:loop_at], w.duration)
            if t_good >= MIN_ADVANCE_S:
                self._accept(task, best_seq, best_q, good, "ok", None, w.start + t_good)
                self._replan(w.start + t_good, task.group_end, task.resumes + 1)
                return
        # a truncated attempt is not failed (nothing to retry) but keeps its flag: its text stops at the budget
        status, flag = ("failed" if best_q.failed else "ok"), best_q.flag
        end = w.end
        if task.cut:
            good, t_seam = self._cut_at(ids, w.duration - SEAM_MARGIN_S)
            if t_seam < MIN_ADVANCE_S and self.word_cut is not None:  # no segment ends in time: cut at a word
                good, t_seam = self.word_cut(best_seq, ids, w, w.duration - SEAM_MARGIN_S) or ([], 0.0)
            if t_seam >= MIN_ADVANCE_S:
                ids, end = good, w.start + t_seam
        elif (t_last := self._closed_end(ids)) is not None and t_last >= MIN_ADVANCE_S \
                and self._speech_in(w.start + t_last, w.end) >= TAIL_SPEECH_S:
            # the decoder closed its last segment with speech left: decode the rest again from where its
            # words end (they may run past that timestamp), unless they already cover the speech
            said = self.words_end(best_seq, ids, w) if self.words_end is not None else None
            tail = max(t_last, said or 0.0)
            if self._speech_in(w.start + tail, w.end) >= TAIL_SPEECH_S:
                end = w.start + tail
        self._accept(task, best_seq, best_q, ids, status, flag, end)
        if end < task.group_end - _EPS:  # a seam or a dropped tail: the next window starts where the text ends
            self._replan(end, task.group_end, 0)

    def _closed_end(self, ids: list[int]) -> float | None:
        """Seconds into the window where the output's last segment closes, or ``None`` when text after its
        last timestamp runs on to the end of the window."""
        good, t = self._cut_at(ids, float("inf"))
        if any(tok < self.t.eot for tok in ids[len(good):]):
            return None
        return t if good else None

    def _speech_in(self, start: float, end: float) -> float:
        return sum(max(0.0, min(e, end) - max(s, start)) for s, e in self.speech)

    def _cut_at(self, ids: list[int], limit_s: float) -> tuple[list[int], float]:
        """The output up to its last closing timestamp at or before ``limit_s`` (seconds into the window),
        and that time; ``([], 0.0)`` when no segment closes by then."""
        ts0 = self.t.timestamp_begin
        best, best_t, open_ts, has_text = 0, 0.0, False, False
        for i, tok in enumerate(ids):
            if tok >= ts0:
                if open_ts and has_text:  # closes a segment with text
                    t = (tok - ts0) * TIME_PRECISION
                    if t > limit_s + _EPS:
                        break
                    best, best_t = i + 1, t
                    open_ts, has_text = False, False
                else:
                    open_ts = True
            elif tok < self.t.eot:
                has_text = True
                open_ts = True  # text with no opening timestamp continues after the previous segment
        return list(ids[:best]), best_t

    def _accept(self, task: _Task, seq: Sequence, q: AttemptQuality, ids: list[int], status: str,
                flag: str | None, end: float) -> None:
        if not self.keep_encoder:  # the window's outcome is decided: only finalize could still want it
            seq.mm_state.pop("encoder", None)
        r = WindowResult(task.window, end, seq, ids, q, len(task.attempts), status, flag)
        w = task.window
        for raw in split_segments(self.t, ids, w.duration):
            if text := self.decode(raw.token_ids).strip():
                start = min(w.start + raw.start, w.end)  # timestamps may run past a short window's audio
                r.preview.append({"start": start, "end": min(max(w.start + raw.end, start), w.end), "text": text})
        self.results.append(r)

    # -- events ---------------------------------------------------------------------------------------
    def _emit_ready(self, final: bool = False) -> None:
        """Send the text of final windows that no unfinished window precedes."""
        if self.on_event is None:
            return
        self.results.sort(key=lambda r: r.window.start)
        horizon = min((t.window.start for t in self.active.values()), default=float("inf"))
        while self._emitted < len(self.results) and (final or self.results[self._emitted].window.start < horizon):
            r = self.results[self._emitted]
            text = " ".join(s["text"] for s in r.preview)
            if text:
                self.on_event("delta", {"text": (" " if self._started_text() else "") + text})
                for s in r.preview:
                    self.on_event("segment", {"start": s["start"], "end": s["end"], "text": s["text"]})
            self._emitted += 1

    def _started_text(self) -> bool:
        return any(r.preview for r in self.results[: self._emitted])


def _kept(seq: Sequence) -> list[int]:
    """Output ids without a repeated tail the loop guard stopped."""
    if seq.finish_reason == FinishReason.REPETITION and isinstance(seq.stop_checker, RepetitionGuard):
        return seq.stop_checker.kept_output(seq.output_ids)
    return list(seq.output_ids)
