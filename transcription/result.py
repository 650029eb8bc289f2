"""Building the result of one transcription (the JSON object :mod:`diarist.contract.result` describes).

The pipeline decodes; this module assembles: the engine sequences' metrics (:func:`sequence_metrics`), the
fields every result has (:func:`whisper_result`), the merge of a multichannel job's per-channel results
(:func:`merge_channels`) and the last fields set once a recording is done, whatever its model family
(:func:`finish_result`: processing time, RTF, warnings, the completeness verdict).
"""

from __future__ import annotations

from typing import Any

from diarist.completeness import assess
from diarist.contract.result import EngineMetrics
from engine.request import Sequence
from transcription.language import LanguageChoice


def sequence_metrics(seqs: list[Sequence]) -> dict[str, Any]:
    """The :class:`diarist.contract.result.EngineMetrics` of a recording's engine sequences (seconds,
    tokens): the queue wait from the first arrival to the first admission, the longest sequence's stage
    times (they ran concurrently), the tokens summed. ``seqs`` must not be empty."""
    first_admit = min((s.timings.admitted or s.timings.arrival) for s in seqs)
    return EngineMetrics(
        queue_wait_s=max(0.0, first_admit - min(s.timings.arrival for s in seqs)),
        encoder_s=max(s.timings.encoder_s for s in seqs),
        prefill_s=max(s.timings.prefill_s for s in seqs),
        decode_s=max(s.timings.decode_s for s in seqs),
        prompt_tokens=sum(s.prompt_len for s in seqs),
        output_tokens=sum(len(s.output_ids) for s in seqs),
    ).to_json()


def whisper_result(model: str | None, duration: float, segments: list[dict], finish: str, metrics: dict,
                   no_speech: bool, language: LanguageChoice, speech: list[tuple[float, float]]) -> dict[str, Any]:
    """The fields of a Whisper result (``duration`` and ``speech`` in seconds); ``coverage`` stays ``None``
    until :func:`finish_result` sets it with the completeness verdict."""
    return {
        "duration": duration,
        **language.result_fields(),
        "model": model,
        "segments": segments,
        "finish_reason": finish,
        "speech": [[s, e] for s, e in speech],
        "coverage": None,
        "no_speech": no_speech,
        "metrics": metrics,
    }


_SUMMED = ("vad_s", "encoder_s", "prefill_s", "decode_s", "prompt_tokens", "output_tokens")
"""Metrics a multichannel job adds over its channels (decoded one after the other)."""


def merge_channels(model: str | None, results: list[dict], frames: int, sample_rate: int) -> dict[str, Any]:
    """One result for a multichannel recording (``frames`` samples per channel at ``sample_rate`` Hz) from
    its channels' results, in channel order: segments labelled ``CH<n>`` and sorted by time, metrics summed
    (the queue wait: the longest), the first finish reason that is not ``stop``, the language of the first
    channel that found one, every channel's speech and windows, and each channel's incomplete reason and warnings."""
    segments = sorted(({**seg, "speaker": f"CH{ch + 1}", "channel": ch}
                       for ch, r in enumerate(results) for seg in r["segments"]),
                      key=lambda s: (s["start"], s["end"]))
    metrics = {k: sum(r["metrics"].get(k, 0) or 0 for r in results) for k in _SUMMED}
    metrics.update(queue_wait_s=max(r["metrics"]["queue_wait_s"] for r in results), diarization_s=0.0,
                   channels=len(results))
    finish = next((r["finish_reason"] for r in results if r["finish_reason"] != "stop"), "stop")
    # channels are decoded (and detected) apart; the first that found a language speaks for the file
    found = next((r for r in results if r["language"] is not None), results[0])
    choice = LanguageChoice(found["language"], found["language_source"], found["language_probability"],
                            found["task"])
    speech = [tuple(sp) for r in results for sp in r["speech"]]  # coverage over every channel's speech
    out = whisper_result(model, frames / sample_rate, segments, finish, metrics, no_speech=not segments,
                         language=choice, speech=speech)
    out["windows"] = [{**w, "channel": ch} for ch, r in enumerate(results) for w in r.get("windows", [])]
    reasons = [f"channel {ch + 1}: {r['incomplete_reason']}" for ch, r in enumerate(results)
               if r.get("incomplete_reason")]
    if reasons:
        out["incomplete"], out["incomplete_reason"] = True, "; ".join(reasons)
    out["warnings"] = [{**w, "message": f"channel {ch + 1}: {w['message']}"}
                       for ch, r in enumerate(results) for w in r.get("warnings", [])]
    return out


def finish_result(result: dict[str, Any], duration: float, processing_s: float, audio_decode_s: float,
           warnings: list[dict], random_weights: bool) -> dict[str, Any]:
    """``result`` (changed in place and returned) with what every family's result ends with:
    ``processing_s``, ``audio_decode_s`` and ``rtf`` (processing / audio seconds; ``None`` for empty audio)
    in its metrics, ``duration`` when the pipeline did not set it, ``random_weights`` when the engine runs
    random weights (the text is noise: said in every result, not only at startup), the decoder's
    ``warnings`` before the pipeline's, and the completeness verdict (:func:`diarist.completeness.assess`:
    ``coverage``, ``incomplete``, ``incomplete_reason``)."""
    result["metrics"]["processing_s"] = processing_s
    result["metrics"]["audio_decode_s"] = audio_decode_s
    result["metrics"]["rtf"] = processing_s / duration if duration > 0 else None
    result.setdefault("duration", duration)
    if random_weights:
        result["random_weights"] = True
    result["warnings"] = warnings + result.get("warnings", [])
    result.update(assess(result).fields())
    return result


FEWER_SPEAKERS = "fewer_speakers"
"""Result warning code: the transcript has fewer speakers than ``num_speakers`` / ``min_speakers`` asked for."""


def speaker_hint_warnings(result: dict[str, Any], num_speakers: int | None, min_speakers: int | None) -> list[dict]:
    """A ``fewer_speakers`` warning (``{code, message, count}``, ``count`` the speakers found) when the
    result names fewer distinct speakers than ``num_speakers`` (or ``min_speakers``) asked for. Speakers are
    counted as the transcript lists them (:attr:`diarist.transcript.Transcript.speakers`): those of the
    segments and those of the diarization's turns. Nothing for an aborted result, or when no hint was given
    or it was met."""
    want = num_speakers or min_speakers
    if not want or result.get("finish_reason") == "abort":
        return []
    found = len({x.get("speaker") for x in [*result.get("segments", []), *(result.get("turns") or [])]
                 if x.get("speaker") is not None})
    if found >= want:
        return []
    hint = f"num_speakers={num_speakers}" if num_speakers else f"min_speakers={min_speakers}"
    return [{"code": FEWER_SPEAKERS, "count": found,
             "message": f"{hint} was asked for; the transcript has {found} speaker(s)"}]
