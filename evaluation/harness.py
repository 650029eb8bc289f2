"""`diarist eval`: transcribe every referenced recording of a data folder and score it.

The data layout and reference loading are in
:mod:`evaluation.references`. Every audio file of the folder is either scored or listed in
``not_scored`` with the reason (no reference, or a reference whose name matches no audio);
items with an approximate transcript (``.APPROX.txt``) are reported but left out of the
totals; items with per-channel references are transcribed with ``multichannel=True``.

Metrics and their definitions are in :mod:`evaluation.scoring`. RTF = processing seconds
(wall time of ``transcribe_fn``, or the result's ``metrics.processing_s`` when
replaying saved results) / audio seconds. Totals pool items the way the scorers do: WER/CER
total errors over total reference length (jiwer's counts), cpWER/cpCER with meeteval's
``combine_error_rates``, DER/JER with pyannote.metrics' summed components and its
``compute_metric``; the mean over items of each rate is reported beside it (``<metric>_mean``).
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diarist.contract.result import TranscriptionResult
from diarist.transcript import Transcript
from evaluation import scoring
from evaluation.references import Item, References, discover, load_references, unmatched_references

__all__ = ["Item", "References", "aggregate", "discover", "evaluate", "load_references", "score_item"]

TranscribeFn = Callable[..., TranscriptionResult]


def score_item(refs: References, t: Transcript, collars: tuple[float, ...]) -> dict[str, Any]:
    """All metrics of one transcript against its loaded references (see module docstring).

    A reference that loaded but cannot be scored adds a message to ``reference_errors``;
    the other metrics are still computed.
    """
    rec: dict[str, Any] = {}
    problems: list[str] = []

    def attempt(name: str, fn: Callable[[], dict]) -> bool:
        try:
            rec.update(fn())
            return True
        except Exception as e:  # noqa: BLE001 - e.g. an STM whose text normalises to nothing
            problems.append(f"{name} scoring failed: {type(e).__name__}: {e}")
            return False

    ref_text = refs.text
    if ref_text is None and refs.speaker_lines is not None:
        ref_text = " ".join(line.text for line in refs.speaker_lines)
    ref_speakers = None
    rec["hyp_words"] = len(scoring.normalize_text(t.text).split())
    if ref_text is not None:
        if not scoring.normalize_text(ref_text):
            rec["expected_no_speech"] = True
            ref_speakers = 0
        else:
            attempt("WER/CER", lambda: scoring.text_errors(ref_text, t.text))
    if refs.speaker_lines is not None and attempt("cpWER", lambda: scoring.cp_errors(refs.speaker_lines, t)):
        rec["cp_reference"] = refs.speaker_source
        ref_speakers = len({line.speaker for line in refs.speaker_lines})
    if refs.rttm is not None and attempt("DER", lambda: scoring.diarization_errors(refs.rttm, t, collars)):
        ref_speakers = len(refs.rttm.labels())
    rec["ref_speakers"] = ref_speakers
    rec["hyp_speakers"] = len(t.speakers)
    rec["speaker_count_error"] = None if ref_speakers is None else len(t.speakers) - ref_speakers
    if problems:
        rec["reference_errors"] = problems
    return rec


def evaluate(data_dir: str | Path, transcribe_fn: TranscribeFn, *, collars: tuple[float, ...] = (0.0, 0.25),
             patterns: list[str] | None = None, timing: str = "wall", save_dir: str | Path | None = None,
             on_start: Callable[[int], None] | None = None,
             on_item: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Transcribe and score every referenced item of ``data_dir``; returns the report dict.

    ``transcribe_fn(path, **hints) -> TranscriptionResult`` (see
    :meth:`Transcript.from_engine`); ``hints`` is ``{"multichannel": True}`` for items
    with per-channel references, else empty. ``patterns``: fnmatch globs on item ids
    (``"en_ami*"``). ``timing``: ``"wall"`` (measure ``transcribe_fn``) or
    ``"reported"`` (use the result's ``metrics.processing_s``). ``save_dir``: write
    each raw result (:meth:`TranscriptionResult.to_json`) as ``<item id with / -> __>.json`` for later
    re-scoring. ``on_start(n)`` is called once with the number of items to run, ``on_item(record)`` after
    each (progress displays).
    Failures (reference, transcription, invalid result) are recorded per item as
    messages. Raises ``FileNotFoundError`` if ``data_dir`` is not a directory.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data directory not found: {data_dir}")
    found, skipped = discover(data_dir)
    items = [i for i in found if any(fnmatch.fnmatch(i.id, p) for p in patterns)] if patterns else found
    records = []
    if on_start:
        on_start(len(items))
    for item in items:
        rec = _run_item(item, transcribe_fn, collars, timing, save_dir)
        records.append(rec)
        if on_item:
            on_item(rec)
    return {"data_dir": str(data_dir), "collars_s_each_side": list(collars), "definitions": DEFINITIONS,
            "overall": aggregate(records, collars), "by_language": by_language(records, collars),
            "items": records,
            "not_scored": [{"id": n.id, "reason": n.reason} for n in skipped
                           if not patterns or any(fnmatch.fnmatch(n.id, p) for p in patterns)],
            "unmatched_references": unmatched_references(data_dir, found)}


def _run_item(item: Item, transcribe_fn: TranscribeFn, collars: tuple[float, ...], timing: str,
              save_dir: str | Path | None) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": item.id, "ref_language": item_language(item.id),
                           "references": {k: str(v) for k, v in
                                          (("txt", item.txt), ("stm", item.stm), ("speakers", item.speakers_txt),
                                           ("rttm", item.rttm)) if v is not None}}
    if item.approximate:
        rec["approximate_reference"] = True
    refs = load_references(item)
    if refs.errors:
        rec["reference_errors"] = list(refs.errors)
    if refs.text is None and refs.speaker_lines is None and refs.rttm is None:
        rec["error"] = "no usable reference file: " + "; ".join(refs.errors)
        return rec
    t0 = time.perf_counter()
    try:
        result = transcribe_fn(item.audio, **item.hints)
        wall = time.perf_counter() - t0
        t = Transcript.from_engine(result)
    except Exception as e:  # noqa: BLE001 - one bad item must not end the run; the message goes in the report
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        (Path(save_dir) / (item.id.replace("/", "__") + ".json")).write_text(json.dumps(result.to_json(), default=str))
    processing = wall if timing == "wall" else result.metrics.processing_s
    rec.update(duration=t.duration, processing_s=processing,
               rtf=processing / t.duration if processing is not None and t.duration > 0 else None,
               finish_reason=t.finish_reason, coverage=t.coverage, no_speech=t.no_speech, model=t.model,
               language=t.language, language_source=t.language_source)
    scored = score_item(refs, t, collars)
    if problems := scored.pop("reference_errors", None):
        rec.setdefault("reference_errors", []).extend(problems)
    rec.update(scored)
    return rec


DEFINITIONS = {
    "normalisation": "NFKC, lowercase, [..]/<..> tags removed, apostrophes deleted, other punctuation -> space, "
                     "whitespace collapsed; zh/ja scored on characters without spaces (no WER)",
    "wer_cer": "jiwer; totals pool errors / reference length over items with exact references (wer, cer); "
               "wer_mean, cer_mean: mean of the items' rates",
    "cpwer_cpcer": "meeteval cpwer on normalised words / single characters, where an .stm or a .txt with its "
                   ".speakers.txt exists; totals pooled with meeteval.wer.combine_error_rates; *_mean: item mean",
    "der_jer": "pyannote.metrics, skip_overlap=False, UEM [0, duration]; der_cX/jer_cX: collar X s on each "
               "side of reference boundaries (md-eval -c X; pyannote collar=2X); hypothesis = the diarization's "
               "turns (else the segments); totals: the items' pyannote components summed and the metric's "
               "compute_metric (as an accumulating pyannote metric pools); *_mean: item mean",
    "rtf": "processing seconds / audio seconds",
    "by_language": "the overall figures per ref_language: the language code that begins an item's folder name "
                   "(en_..., zh_..., ja_...: the shared data's convention); 'other' for the rest (music, noise, "
                   "mixed-language items); language/language_source: what the transcript says",
    "speaker_count_error": "hypothesis speakers - reference speakers (RTTM labels, else STM speakers, "
                           "else 0 for an empty transcript); totals: speaker_count_error_mean (signed: the bias), "
                           "speaker_count_abs_error_mean, speaker_count_exact and speaker_count_within_1 (items)",
    "der_split": "der_cX_detail: missed = missed_speech (reference speech where the hypothesis has no speaker, "
                 "each reference speaker counted) + missed_overlap (hypothesis has speakers, fewer than the "
                 "reference); seconds per item; totals der_cX_<part>: the items' seconds over their summed "
                 "reference speech (they add up to der_cX)",
    "overlap_two_speakers": "overlap_cX_two_speakers: of the reference's overlapped time (two or more reference "
                            "speakers, outside the collars), the share where the hypothesis has two or more "
                            "speakers too (identities not compared; confusion says that); overlap_cX_s: that "
                            "reference time in seconds",
}


def item_language(item_id: str) -> str:
    """The language code that begins the item's folder name (``zh_aishell1.../x.wav`` -> ``zh``), else
    ``"other"``."""
    from engine.checkpoints import WHISPER_LANGUAGES

    head = item_id.split("/", 1)[0].split("_", 1)[0].lower()
    return head if head in WHISPER_LANGUAGES else "other"


def by_language(records: list[dict], collars: tuple[float, ...] = (0.0, 0.25)) -> dict[str, dict[str, Any]]:
    """:func:`aggregate` per ``ref_language`` (see ``DEFINITIONS["by_language"]``)."""
    langs = sorted({r.get("ref_language", "other") for r in records})
    return {lang: aggregate([r for r in records if r.get("ref_language", "other") == lang], collars)
            for lang in langs}


def _pool(records: list[dict], err: str, n: str) -> float | None:
    rows = [r for r in records if r.get(err) is not None and not r.get("approximate_reference")]
    total = sum(r[n] for r in rows)
    return sum(r[err] for r in rows) / total if total else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def aggregate(records: list[dict], collars: tuple[float, ...] = (0.0, 0.25)) -> dict[str, Any]:
    """Totals over item records (pooled rates, means, counts); see module docstring."""
    ok = [r for r in records if "error" not in r]
    exact = [r for r in ok if not r.get("approximate_reference")]
    out: dict[str, Any] = {"items": len(records), "failed": len(records) - len(ok),
                           "wer": _pool(ok, "wer_errors", "ref_words"), "cer": _pool(ok, "cer_errors", "ref_chars"),
                           "cpwer": scoring.pool_cp([r["cp_detail"]["words"] for r in exact
                                                     if "words" in (r.get("cp_detail") or {})]),
                           "cpcer": scoring.pool_cp([r["cp_detail"]["chars"] for r in exact
                                                     if "chars" in (r.get("cp_detail") or {})])}
    for m in ("wer", "cer", "cpwer", "cpcer"):
        out[f"{m}_mean"] = _mean([r[m] for r in exact if r.get(m) is not None])
    for c in collars:
        key = f"c{c:g}"
        for m in ("der", "jer"):
            scored = [r for r in ok if r.get(f"{m}_{key}") is not None]
            out[f"{m}_{key}"] = scoring.pool_diarization(m, [r[f"{m}_{key}_components"] for r in scored])
            out[f"{m}_{key}_mean"] = _mean([r[f"{m}_{key}"] for r in scored])
        details = [r[f"der_{key}_detail"] for r in ok if r.get(f"der_{key}_detail")]
        total = sum(d["total"] for d in details)
        for part in ("missed_speech", "missed_overlap", "false_alarm", "confusion"):
            out[f"der_{key}_{part}"] = sum(d.get(part, 0.0) for d in details) / total if total else None
        overlap = sum(d.get("overlap", 0.0) for d in details)
        out[f"overlap_{key}_s"] = overlap
        out[f"overlap_{key}_two_speakers"] = (sum(d.get("overlap_two_speakers", 0.0) for d in details) / overlap
                                              if overlap else None)
    errs = [r["speaker_count_error"] for r in ok if r.get("speaker_count_error") is not None]
    out.update(speaker_count_items=len(errs), speaker_count_error_mean=_mean(errs),
               speaker_count_abs_error_mean=_mean([abs(e) for e in errs]),
               speaker_count_exact=sum(e == 0 for e in errs), speaker_count_within_1=sum(abs(e) <= 1 for e in errs))
    silent = [r for r in ok if r.get("expected_no_speech")]
    out.update(no_speech_items=len(silent), no_speech_items_with_words=sum(r["hyp_words"] > 0 for r in silent),
               no_speech_items_with_speakers=sum(r["hyp_speakers"] > 0 for r in silent))
    timed = [r for r in ok if r.get("processing_s") is not None]
    audio = sum(r["duration"] for r in timed)
    out.update(audio_s=audio, processing_s=sum(r["processing_s"] for r in timed),
               rtf=sum(r["processing_s"] for r in timed) / audio if audio else None)
    return out
