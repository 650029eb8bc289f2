"""Accuracy metrics for one recording: WER/CER (jiwer), cpWER/cpCER (meeteval), DER/JER (pyannote.metrics).

Text normalisation (applied to reference and hypothesis alike, :func:`normalize_text`):
Unicode NFKC, lowercase, bracketed/angle-bracketed event tags removed (``[laugh]``,
``<noise>``), apostrophes deleted (``don't`` -> ``dont``), every other Unicode
punctuation character (category P*) replaced by a space, whitespace collapsed. No
number or spelling normalisation (``Mr.`` vs ``MISTER`` counts as an error).

Texts whose reference is mostly Han/Hiragana/Katakana (zh, ja) are scored on
characters with all whitespace removed (CER); WER is not defined for them. For other
texts CER is jiwer's character error rate on the normalised text (spaces included).
cpCER is cpWER computed on single characters (whitespace removed).

DER/JER: ``collar`` here is the NIST md-eval forgiveness collar, seconds on *each*
side of every reference boundary (``md-eval -c 0.25``); pyannote.metrics' ``collar``
is the total width, so we pass ``2 * collar``. Overlapped speech is scored
(``skip_overlap=False``). The scored region (UEM) is ``[0, duration]``.

Heavy libraries are imported inside the functions so that importing diarist stays cheap.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from diarist.transcript import Transcript

_TAG = re.compile(r"\[[^\]]*\]|<[^>]*>")
_APOSTROPHES = re.compile(r"['\u2019\u02bc]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


class ReferenceFileError(ValueError):
    """A reference file is missing, unreadable or inconsistent; the message says which and why."""


def normalize_text(text: str) -> str:
    """Normalise a transcript for WER/CER (rules in the module docstring)."""
    text = _TAG.sub(" ", unicodedata.normalize("NFKC", text).lower())
    text = _APOSTROPHES.sub("", text)
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)
    return " ".join(text.split())


def is_cjk(text: str) -> bool:
    """True when at least half the non-space characters are Han or kana (score by characters)."""
    chars = [c for c in text if not c.isspace()]
    return bool(chars) and sum(bool(_CJK.match(c)) for c in chars) * 2 >= len(chars)


def _chars(text: str) -> str:
    return " ".join(c for c in text if not c.isspace())


def text_errors(reference: str, hypothesis: str) -> dict[str, Any]:
    """WER and CER of ``hypothesis`` against a non-empty ``reference`` (both raw text).

    Returns ``{wer, wer_errors, wer_deletions, ref_words, cer, cer_errors, ref_chars, scoring}`` where
    ``scoring`` is ``"words"`` or ``"chars"`` (zh/ja); WER fields are ``None`` for chars.
    ``wer_deletions`` counts reference words the hypothesis lost (jiwer's alignment), the figure behind
    "no excerpt loses more than 20% of its reference words".
    Raises ``ReferenceFileError`` if the reference is empty after normalisation.
    """
    import jiwer

    ref, hyp = normalize_text(reference), normalize_text(hypothesis)
    if not ref:
        raise ReferenceFileError("reference text is empty after normalisation")
    out: dict[str, Any] = {"wer": None, "wer_errors": None, "wer_deletions": None, "ref_words": None}
    cjk = is_cjk(ref)
    if cjk:
        ref_c, hyp_c = ref.replace(" ", ""), hyp.replace(" ", "")
    else:
        ref_c, hyp_c = ref, hyp
        w = jiwer.process_words(ref, hyp)
        errors = w.substitutions + w.deletions + w.insertions
        n = w.substitutions + w.deletions + w.hits
        out.update(wer=errors / n, wer_errors=errors, wer_deletions=w.deletions, ref_words=n)
    c = jiwer.process_characters(ref_c, hyp_c)
    errors = c.substitutions + c.deletions + c.insertions
    n = c.substitutions + c.deletions + c.hits
    out.update(cer=errors / n, cer_errors=errors, ref_chars=n, scoring="chars" if cjk else "words")
    return out


def cp_errors(reference: list[Any], transcript: Transcript, session: str = "audio") -> dict[str, Any]:
    """cpWER and cpCER (meeteval) of the transcript's speaker segments against a speaker-attributed reference.

    ``reference`` is a list of :class:`evaluation.references.SpeakerLine` (``speaker``, ``text``, optional
    ``start``/``end``), from an ``.stm`` or a ``.txt`` + ``.speakers.txt`` pair. cpWER needs no times: each
    speaker's words are concatenated in order (reference lines without times keep their line order).
    Returns ``{cpwer, cpwer_errors, cp_ref_words, cpcer, cpcer_errors, cp_ref_chars, cp_detail}``
    (cpWER fields ``None`` for zh/ja references, scored by characters only); ``cp_detail`` holds
    meeteval's error-rate fields (``words``/``chars``) so that totals pool with
    ``meeteval.wer.combine_error_rates``.
    Raises ``ReferenceFileError`` when the reference has no words after normalisation.
    """
    import dataclasses

    import meeteval
    from meeteval.io import SegLST

    ref_norm = " ".join(normalize_text(r.text) for r in reference)
    if not ref_norm.strip():
        raise ReferenceFileError("the speaker-attributed reference has no words after normalisation")
    cjk = is_cjk(ref_norm)

    def seglst(items, char_level):
        rows = []
        for spk, start, end, text in items:
            norm = normalize_text(text)
            rows.append({"session_id": session, "speaker": spk, "start_time": float(start),
                         "end_time": float(end), "words": _chars(norm) if char_level else norm})
        if not rows:  # meeteval treats a missing session as a system failure, not as silence
            rows.append({"session_id": session, "speaker": "none", "start_time": 0.0, "end_time": 0.0,
                         "words": ""})
        return SegLST(rows)

    # lines without times keep their order through their index (meeteval sorts each speaker's lines by time)
    ref_items = [(r.speaker, i if r.start is None else r.start, i if r.end is None else r.end, r.text)
                 for i, r in enumerate(reference)]
    hyp_items = [(s.speaker or "unknown", s.start, s.end, s.text) for s in transcript.segments]
    out: dict[str, Any] = {"cpwer": None, "cpwer_errors": None, "cp_ref_words": None, "cp_detail": {}}

    def detail(r: Any) -> dict:  # JSON-able; ErrorRate.from_dict reads it back (the assignment tells the type)
        d = dataclasses.asdict(r)
        d["assignment"] = [list(a) for a in d.get("assignment") or ()]
        return d

    if not cjk:
        r = meeteval.wer.cpwer(seglst(ref_items, False), seglst(hyp_items, False))[session]
        out.update(cpwer=float(r.error_rate), cpwer_errors=int(r.errors), cp_ref_words=int(r.length))
        out["cp_detail"]["words"] = detail(r)
    r = meeteval.wer.cpwer(seglst(ref_items, True), seglst(hyp_items, True))[session]
    out.update(cpcer=float(r.error_rate), cpcer_errors=int(r.errors), cp_ref_chars=int(r.length))
    out["cp_detail"]["chars"] = detail(r)
    return out


def pool_cp(details: list[dict]) -> float | None:
    """cpWER (or cpCER) over many items as meeteval pools them (``combine_error_rates``: total errors over
    total reference length); ``details`` are the ``cp_detail["words"|"chars"]`` of :func:`cp_errors`."""
    if not details:
        return None
    from meeteval.wer import ErrorRate, combine_error_rates

    total = combine_error_rates(*(ErrorRate.from_dict(dict(d)) for d in details))
    return None if total.length == 0 else float(total.error_rate)


def hypothesis_annotation(transcript: Transcript, uri: str) -> Any:
    """Speaker turns of the transcript as a pyannote ``Annotation``: the same turns RTTM export writes
    (the diarization's ``turns`` when present, else the segments)."""
    from pyannote.core import Annotation, Segment

    ann = Annotation(uri=uri)
    spans = transcript.turns if transcript.turns is not None else transcript.segments
    for i, s in enumerate(spans):
        if s.end > s.start:
            ann[Segment(s.start, s.end), i] = s.speaker or "unknown"
    return ann


def diarization_errors(reference: Any, transcript: Transcript, collars: tuple[float, ...] = (0.0, 0.25)
                       ) -> dict[str, Any]:
    """DER and JER of the transcript's turns against a reference ``pyannote.core.Annotation``.

    For every ``c`` in ``collars`` (seconds each side, md-eval convention) returns keys
    ``der_c{c}``, ``jer_c{c}``, the DER components in seconds ``der_c{c}_detail``
    ``{missed, false_alarm, confusion, total, missed_speech, missed_overlap, overlap, overlap_two_speakers}``
    (``missed`` split into speech no hypothesis speaker covers and overlap given too few speakers, and the
    reference's overlapped time with the part of it the hypothesis gives two speakers: :func:`overlap_counts`)
    and pyannote's own components of both metrics
    ``der_c{c}_components`` / ``jer_c{c}_components`` (what :func:`pool_diarization` sums). Rates are
    ``None`` when the scored reference speech is empty.
    """
    from pyannote.core import Segment, Timeline
    from pyannote.metrics.diarization import DiarizationErrorRate, JaccardErrorRate

    hyp = hypothesis_annotation(transcript, reference.uri or "audio")
    end = max(transcript.duration, reference.get_timeline().extent().end if reference else 0.0)
    uem = Timeline([Segment(0.0, end)]) if end > 0 else None
    out: dict[str, Any] = {}
    for c in collars:
        key = f"c{c:g}"
        if uem is None or not reference:
            out[f"der_{key}"] = out[f"jer_{key}"] = None
            continue
        metric = DiarizationErrorRate(collar=2 * c, skip_overlap=False)
        d = metric(reference, hyp, uem=uem, detailed=True)
        total = d["total"]
        out[f"der_{key}"] = d["diarization error rate"] if total > 0 else None
        ref_c, hyp_c, uem_c = metric.uemify(reference, hyp, uem=uem, collar=2 * c, returns_uem=True)
        counts = overlap_counts(ref_c, hyp_c, uem_c)
        out[f"der_{key}_detail"] = {"missed": d["missed detection"], "false_alarm": d["false alarm"],
                                    "confusion": d["confusion"], "total": total,
                                    "missed_speech": counts["missed_speech"],
                                    "missed_overlap": counts["missed_overlap"],
                                    "overlap": counts["overlap"], "overlap_two_speakers": counts["overlap_two_speakers"]}
        out[f"der_{key}_components"] = {k: float(d[k]) for k in DiarizationErrorRate.metric_components()}
        j = JaccardErrorRate(collar=2 * c, skip_overlap=False)(reference, hyp, uem=uem, detailed=True)
        out[f"jer_{key}"] = float(j[JaccardErrorRate.metric_name()])
        out[f"jer_{key}_components"] = {k: float(j[k]) for k in JaccardErrorRate.metric_components()}
    return out


def overlap_counts(reference: Any, hypothesis: Any, uem: Any) -> dict[str, float]:
    """Speaker counts of reference and hypothesis compared inside ``uem``, exactly (on the elementary spans
    between all their boundaries), all in seconds:

    - ``missed_speech``: sum of ``n_ref`` where the hypothesis has no speaker;
    - ``missed_overlap``: sum of ``n_ref - n_hyp`` where the hypothesis has some speakers but fewer than the
      reference (``missed_speech + missed_overlap`` is pyannote's missed detection);
    - ``overlap``: time where the reference has two or more speakers;
    - ``overlap_two_speakers``: the part of ``overlap`` where the hypothesis has two or more speakers too.

    ``reference``/``hypothesis`` are pyannote ``Annotation``s, ``uem`` a ``Timeline`` (after pyannote's
    ``uemify``, so collars are already cut out). Speaker identities are not compared here: the confusion of
    DER says whether the right ones were chosen.
    """
    import numpy as np

    out = {"missed_speech": 0.0, "missed_overlap": 0.0, "overlap": 0.0, "overlap_two_speakers": 0.0}
    def spans(ann: Any) -> list[tuple[float, float]]:  # one speaker's own overlapping turns count once
        return [(s.start, s.end) for label in ann.labels() for s in ann.label_timeline(label).support()]

    ref, hyp = spans(reference), spans(hypothesis)
    for region in uem:
        edges = sorted({region.start, region.end} | {t for a, b in ref + hyp for t in (a, b)
                                                      if region.start < t < region.end})
        if len(edges) < 2:
            continue
        e = np.array(edges)
        mid, dur = (e[1:] + e[:-1]) / 2, np.diff(e)

        nr, nh = _active_count(ref, mid), _active_count(hyp, mid)
        out["missed_speech"] += float((dur * nr * (nh == 0)).sum())
        out["missed_overlap"] += float((dur * np.maximum(nr - nh, 0) * (nh > 0)).sum())
        out["overlap"] += float((dur * (nr >= 2)).sum())
        out["overlap_two_speakers"] += float((dur * ((nr >= 2) & (nh >= 2))).sum())
    return out


def _active_count(spans: list[tuple[float, float]], t: Any) -> Any:
    """How many of ``spans`` hold each time of ``t`` (``[n]`` float seconds) -> ``[n]`` int."""
    import numpy as np

    n = np.zeros(t.size, int)
    for a, b in spans:
        n += (t > a) & (t < b)
    return n


def pool_diarization(metric: str, components: list[dict]) -> float | None:
    """DER (``metric="der"``) or JER (``"jer"``) over many items as pyannote.metrics pools them: the items'
    components summed (what an accumulating metric object holds), then the metric's own ``compute_metric``
    (DER: total missed + false alarm + confusion over total reference speech; JER: summed speaker errors
    over the summed speaker count). ``components`` are :func:`diarization_errors`'s ``*_components``."""
    if not components:
        return None
    from pyannote.metrics.diarization import DiarizationErrorRate, JaccardErrorRate

    cls = {"der": DiarizationErrorRate, "jer": JaccardErrorRate}[metric]
    total = {k: sum(c[k] for c in components) for k in cls.metric_components()}
    if metric == "der" and total["total"] == 0:
        return None
    return float(cls().compute_metric(total))
