"""Give transcript words and segments the speaker of the turns they overlap, splitting segments where the
speaker changes between words (also inside overlapped speech, where two turns cover a word)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from transcription.diarization.turns import Turn


def _speaker_at(start: float, end: float, turns: list[Turn], starts: np.ndarray, ends: np.ndarray,
                speakers: np.ndarray, prefer: int | None = None) -> int:
    """Speaker with the most time overlapping ``[start, end]``; a tie (a word inside overlapped speech)
    goes to ``prefer`` when it is among the tied, else to the lowest index; if no turn overlaps, the
    turn nearest in time."""
    ov = np.minimum(ends, end) - np.maximum(starts, start)
    if ov.size and ov.max() > 0:
        per = np.zeros(int(speakers.max()) + 1)
        np.add.at(per, speakers, np.clip(ov, 0, None))
        tied = np.flatnonzero(per >= per.max() - 1e-6)
        return prefer if prefer is not None and prefer in tied else int(tied[0])
    mid = (start + end) / 2
    gap = np.maximum(starts - mid, 0) + np.maximum(mid - ends, 0)
    return int(speakers[int(gap.argmin())])


def _candidates(start: float, end: float, starts: np.ndarray, ends: np.ndarray, speakers: np.ndarray) -> list[int]:
    """Speakers tied for the most time over ``[start, end]`` (more than one: the word lies in overlapped
    speech, where time alone cannot say whose it is); ``[]`` when no turn overlaps it."""
    ov = np.minimum(ends, end) - np.maximum(starts, start)
    if not ov.size or ov.max() <= 0:
        return []
    per = np.zeros(int(speakers.max()) + 1)
    np.add.at(per, speakers, np.clip(ov, 0, None))
    return np.flatnonzero(per >= per.max() - 1e-6).tolist()


_SENTENCE_END = (".", "?", "!", "…")


def _split_overlap_runs(words: list[dict], cands: list[list[int]], labels: list[int]) -> list[int]:
    """Speakers of words in overlapped speech, from their neighbours: ``labels`` holds a speaker for every
    word (ties already given the segment's speaker) and is returned with each run of tied words
    (``len(cands[i]) > 1``) re-labelled. When the untied word before the run and the one after it belong
    to two different tied speakers ``L`` and ``R`` (one talker finishing while the next starts, the usual
    overlap at a change of turn), the run's first words go to ``L`` and the rest to ``R``, cut after a word
    that ends a sentence, else at the longest pause between words (Whisper writes one stream of text, in
    time order, so one talker's words come before the other's). When only one side has such a neighbour,
    the whole run goes to it. Otherwise the labels stay."""
    out = list(labels)
    i, n = 0, len(words)
    while i < n:
        if len(cands[i]) <= 1:
            i += 1
            continue
        j = i
        while j < n and len(cands[j]) > 1:
            j += 1
        run = range(i, j)  # words i..j-1 are tied
        left = labels[i - 1] if i > 0 and labels[i - 1] in cands[i] else None
        right = labels[j] if j < n and labels[j] in cands[j - 1] else None
        if left is not None and right is not None and left != right:
            best, cut = -1.0, i
            for c in range(i, j + 1):  # words i..c-1 -> left, c..j-1 -> right
                prev, nxt = words[c - 1], words[c] if c < n else None
                gap = 0.0 if nxt is None else max(0.0, nxt["start"] - prev["end"])
                score = gap + (10.0 if prev["word"].strip().endswith(_SENTENCE_END) else 0.0)
                if score > best:
                    best, cut = score, c
            for k in run:
                out[k] = left if k < cut else right
        elif left is not None or right is not None:
            for k in run:
                out[k] = left if left is not None else right
        i = j
    return out


def _trim(start: float, end: float, core: tuple[float, float], speaker: int, starts: np.ndarray,
          ends: np.ndarray, speakers: np.ndarray) -> tuple[float, float]:
    """``[start, end]`` shrunk to the span of the speaker's turns that overlap ``core`` (the piece's words;
    the whole piece when no turn overlaps them); unchanged when no turn of the speaker overlaps it."""
    for a, b in (core, (start, end)):
        mine = (speakers == speaker) & (ends >= a) & (starts <= b) & (ends > start) & (starts < end)
        if mine.any():
            return max(start, float(starts[mine].min())), min(end, float(ends[mine].max()))
    return start, end


def assign_speakers(segments: list[dict], turns: list[Turn]) -> list[dict]:
    """Label transcript segments with speakers, splitting a segment where its words change speaker.

    Args:
        segments: dicts with ``start``, ``end`` (seconds), ``text`` and optionally ``words``
            (``[{"word", "start", "end", ...}]``, in order); other keys are copied to each piece.
        turns: speaker turns (``diarize``), any order.
    Returns:
        New segment dicts in order, each with an int ``speaker``. A segment with words becomes one piece
        per run of consecutive words of one speaker: a piece's ``words`` are its run, its ``text`` their
        concatenation (stripped), its start is the first word's start and its end the last word's end;
        the first piece starts no later than the segment and the last ends no earlier (Whisper's
        segment timestamps and the aligned words can disagree). Each piece is then trimmed to the span
        of its speaker's turns that its words overlap, and its words' times are clipped into it:
        Whisper's segment edges often reach into silence (a window start, a pause) that turns leave out.
        ``start <= end`` always. Each word gets the speaker it overlaps most, or the nearest turn when it
        overlaps none. Words that overlap two speakers equally (overlapped speech) take their speaker from
        the words around them (:func:`_split_overlap_runs`: where one talker finishes over the next one's
        start, each keeps its own words, so the second talker's words land in a segment of their own),
        else the speaker the whole segment overlaps most. A segment without words is labelled (and trimmed) as a whole. With
        no turns at all every segment gets speaker 0 and keeps its times.
    """
    starts = np.array([t.start for t in turns], float)
    ends = np.array([t.end for t in turns], float)
    speakers = np.array([t.speaker for t in turns], int)
    out: list[dict] = []
    for seg in segments:
        words = seg.get("words") or []
        base = {k: v for k, v in seg.items() if k not in ("words", "speaker")}
        if not turns:
            out.append({**base, "words": [dict(w, speaker=0) for w in words], "speaker": 0} if words
                       else {**base, "speaker": 0})
            continue
        if not words:
            spk = _speaker_at(seg["start"], seg["end"], turns, starts, ends, speakers)
            a, b = _trim(seg["start"], seg["end"], (seg["start"], seg["end"]), spk, starts, ends, speakers)
            out.append({**base, "start": a, "end": b, "speaker": spk})
            continue
        # a tie inside overlapped speech goes to the speaker of the whole segment (Whisper's segments are
        # mostly one talker's utterance), so a speaker change needs evidence
        major = _speaker_at(seg["start"], max(seg["end"], words[-1]["end"]), turns, starts, ends, speakers)
        labels = [_speaker_at(w["start"], w["end"], turns, starts, ends, speakers, major) for w in words]
        labels = _split_overlap_runs(words, [_candidates(w["start"], w["end"], starts, ends, speakers)
                                             for w in words], labels)
        labelled = [dict(w, speaker=spk) for w, spk in zip(words, labels, strict=True)]
        runs: list[list[dict]] = []
        for w in labelled:
            if runs and runs[-1][-1]["speaker"] == w["speaker"]:
                runs[-1].append(w)
            else:
                runs.append([w])
        for i, run in enumerate(runs):
            start = min(seg["start"], run[0]["start"]) if i == 0 else run[0]["start"]
            end = max(seg["end"], run[-1]["end"]) if i == len(runs) - 1 else run[-1]["end"]
            start, end = _trim(start, max(end, start), (run[0]["start"], run[-1]["end"]), run[0]["speaker"],
                               starts, ends, speakers)
            for w in run:
                w["start"] = min(max(w["start"], start), end)
                w["end"] = min(max(w["end"], w["start"]), end)
            out.append({
                **base,
                "start": start,
                "end": end,
                "text": "".join(w["word"] for w in run).strip(),
                "words": run,
                "speaker": run[0]["speaker"],
            })
    return out
