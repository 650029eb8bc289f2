"""MOSS-TD recordings longer than the context: sections cut at silences, one sequence each, and speaker
labels linked across sections with the cascade's speaker embedder, so one person keeps one label.

When: a recording runs as one sequence while its prompt leaves room for a dense meeting's output
(:data:`DENSE_TOKENS_PER_S` per audio second; :func:`fits`). Past that it is cut into the fewest sections
that each fit, every cut in the longest silence (Silero VAD) of the last 40 % of the section's allowed span.
MOSS-TD numbers speakers per request in order of appearance, so every section restarts at S01 (the complaint
of other ports' users, CrispASR#292); :func:`link_speakers` gives each section speaker a CAM++ embedding
of their own segments and matches it to the speakers of the sections before (Hungarian assignment on cosine
distance, accepted below the cascade's clustering threshold), a new label when nobody matches.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from diarist.contract.result import EngineMetrics
from engine.models.moss_td_prompt import build_prompt
from transcription.audio import SAMPLE_RATE

DENSE_TOKENS_PER_S = 6.0
"""Output tokens per audio second a section must leave room for: dense meetings decode at about 4.5
(shared/docs/moss_td.md §4); a third more as headroom."""
MIN_SECTION_S = 60.0
EMBED_WINDOW_S = 10.0  # longest piece of one segment fed to the embedder
EMBED_MAX_WINDOWS = 24  # the longest segments of a speaker, per section


def fits(engine, num_samples: int, prompt: str | None = None) -> bool:
    """True when ``num_samples`` of audio run as one sequence: prompt plus ``DENSE_TOKENS_PER_S`` output
    tokens per second within the engine's context."""
    info = engine.loaded.info
    p = build_prompt(engine.tokenizer, num_samples, prompt, info["marker_every_s"], info.get("chat_template"))
    return len(p.ids) + math.ceil(DENSE_TOKENS_PER_S * num_samples / SAMPLE_RATE) <= engine.max_context


def longest_section_s(engine, prompt: str | None = None) -> float:
    """The longest section (seconds, whole) that :func:`fits` (binary search; prompts grow with audio).

    Raises:
        ValueError: not even :data:`MIN_SECTION_S` fits (a context far too small for this model).
    """
    lo, hi = MIN_SECTION_S, MIN_SECTION_S
    if not fits(engine, int(lo * SAMPLE_RATE), prompt):
        raise ValueError(f"the {engine.max_context}-token context holds less than {MIN_SECTION_S:.0f} s of audio")
    while fits(engine, int(hi * 2 * SAMPLE_RATE), prompt):
        hi *= 2
    hi *= 2
    while hi - lo > 1.0:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(engine, int(mid * SAMPLE_RATE), prompt) else (lo, mid)
    return math.floor(lo)


def plan_sections(wave: np.ndarray, max_s: float, speech: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``(start, end)`` seconds of consecutive sections covering ``wave``, each at most ``max_s`` long, each
    cut at the middle of the longest gap between ``speech`` regions in the last 40 % of its span (at
    ``max_s`` when there is no gap there)."""
    duration = len(wave) / SAMPLE_RATE
    out, start = [], 0.0
    while duration - start > max_s:
        lo, hi = start + 0.6 * max_s, start + max_s
        gaps = [(b[0] - a[1], (a[1] + b[0]) / 2) for a, b in itertools.pairwise(speech)]
        gaps = [(g, mid) for g, mid in gaps if lo <= mid <= hi and g > 0]
        cut = max(gaps)[1] if gaps else hi
        out.append((start, cut))
        start = cut
    out.append((start, duration))
    return out


@dataclass
class _Speaker:
    label: str
    total: np.ndarray  # sum of the unit embeddings seen for this person


def _speaker_embedding(embedder, wave: np.ndarray, segments: list[dict]) -> np.ndarray | None:
    windows = sorted(((s["start"], min(s["end"], s["start"] + EMBED_WINDOW_S)) for s in segments
                      if s.get("end") is not None and s["end"] - s["start"] >= 0.5),
                     key=lambda w: w[0] - w[1])[:EMBED_MAX_WINDOWS]
    if not windows:
        return None
    emb = embedder.embed(wave, windows)
    weights = np.array([e - s for s, e in windows])[:, None]
    mean = (emb * weights).sum(axis=0)
    return mean / max(float(np.linalg.norm(mean)), 1e-12)


def link_speakers(wave: np.ndarray, sections: list[list[dict]], embedder, threshold: float) -> list[list[dict]]:
    """Relabel each section's segments (absolute times in ``wave``) with labels consistent over the file.

    Args:
        wave: float32 ``[n]`` 16 kHz, the whole recording.
        sections: per section, its segments ``{"speaker", "start", "end", "text"}`` with section-local
            labels and absolute times.
        embedder: ``embed(wave, windows) -> [k, d]`` unit vectors (the cascade's CAM++).
        threshold: largest cosine distance at which two section speakers are one person.
    Returns:
        The segments with global labels ``S01``, ``S02``... in order of first appearance over the file.
    """
    from scipy.optimize import linear_sum_assignment

    people: list[_Speaker] = []
    out = []
    for segs in sections:
        local = list(dict.fromkeys(s["speaker"] for s in segs))
        embs = {sp: _speaker_embedding(embedder, wave, [s for s in segs if s["speaker"] == sp]) for sp in local}
        known = [sp for sp in local if embs[sp] is not None]
        mapping: dict[str, str] = {}
        if known and people:
            cent = np.stack([p.total / max(float(np.linalg.norm(p.total)), 1e-12) for p in people])
            dist = 1.0 - np.stack([embs[sp] for sp in known]) @ cent.T
            for r, c in zip(*linear_sum_assignment(dist), strict=True):
                if dist[r, c] < threshold:
                    mapping[known[r]] = people[c].label
                    people[c].total = people[c].total + embs[known[r]]
        for sp in local:  # in order of appearance: nobody matched, a new person
            if sp not in mapping:
                label = f"S{len(people) + 1:02d}"
                dim = next((e.shape[0] for e in embs.values() if e is not None), 1)
                people.append(_Speaker(label, embs[sp] if embs[sp] is not None else np.zeros(dim, np.float32)))
                mapping[sp] = label
        out.append([{**s, "speaker": mapping[s["speaker"]]} for s in segs])
    return out


def _offset(seg: dict, t0: float) -> dict:
    return {**seg, "start": seg["start"] + t0, "end": None if seg.get("end") is None else seg["end"] + t0}


def transcribe_sections(engine, wave: np.ndarray, options, on_event, should_cancel=None) -> dict:
    """:func:`transcription.moss_td.pipeline.transcribe_moss` for a recording that does not :func:`fit`: its
    sections run as concurrent sequences (the engine batches them), then their speakers are linked. Events:
    ``started``, then, once every section is done, the linked ``segment`` events and the text as one
    ``delta``. The result also has ``sections`` (``[{"start", "end"}]``, seconds).

    Raises:
        RequestRejected: a section cannot run (``kv_capacity``: the KV cache holds less than one section).
        EngineError: a section failed inside the engine.
    """
    from engine.request import FinishReason
    from transcription.audio.vad import detect_speech
    from transcription.diarization.embedders import CamPlusPlusEmbedder
    from transcription.diarization.pipeline import THRESHOLD
    from transcription.errors import EngineError
    from transcription.moss_td.sequence import build_moss_sequence, moss_result

    duration = len(wave) / SAMPLE_RATE
    prompt = getattr(options, "prompt", None)
    plan = plan_sections(wave, longest_section_s(engine, prompt), detect_speech(wave, segmentation=False))
    asked = getattr(options, "max_new_tokens", None)
    temperature = getattr(options, "temperature", None)
    seqs = []
    for a, b in plan:
        budget = None if asked is None else max(1, math.ceil(asked * (b - a) / duration))
        seq = build_moss_sequence(engine, wave[round(a * SAMPLE_RATE) : round(b * SAMPLE_RATE)], budget, prompt,
                                  temperature)
        seq.admission_class = getattr(options, "admission_class", "default")
        seqs.append(seq)
    if on_event:
        on_event("started", {})
    for seq in seqs:
        engine.submit(seq)
    engine.run_until_done(seqs, should_cancel=should_cancel)
    failed = [s for s in seqs if s.finish_reason == FinishReason.ERROR]
    if failed:
        raise EngineError(failed[0].error or "engine step failed")
    results = [moss_result(s, engine.tokenizer, b - a) for s, (a, b) in zip(seqs, plan, strict=True)]
    device = str(engine.device) if engine.device.type == "cuda" else "cpu"
    linked = link_speakers(wave, [[_offset(x, a) for x in r["segments"]] for r, (a, _) in zip(results, plan,
                                                                                              strict=True)],
                           CamPlusPlusEmbedder(device), THRESHOLD)
    segments = [{**x, "end": x["end"] if x.get("end") is not None else x["start"]} for part in linked for x in part]
    if on_event:
        for x in segments:
            on_event("segment", {k: x.get(k) for k in ("start", "end", "text", "speaker")})
        if segments:
            on_event("delta", {"text": " ".join(x["text"] for x in segments)})
    finish = next((r["finish_reason"] for r in results if r["finish_reason"] != "stop"), "stop")
    issues = [f"section {i + 1}: {m}" for i, r in enumerate(results) for m in r["parse_issues"]]
    t = [s.timings for s in seqs]
    metrics = {**EngineMetrics(queue_wait_s=max(x.queue_wait_s for x in t), encoder_s=sum(x.encoder_s for x in t),
                               prefill_s=sum(x.prefill_s for x in t), decode_s=max(x.decode_s for x in t),
                               prompt_tokens=sum(r["prompt_tokens"] for r in results),
                               output_tokens=sum(r["output_tokens"] for r in results)).to_json(),
               "vad_s": 0.0, "diarization_s": 0.0}
    last = max((x["end"] for x in segments), default=0.0)
    return {"duration": duration, "segments": segments, "finish_reason": finish,
            "coverage": min(1.0, last / duration) if duration > 0 else 0.0, "no_speech": not segments,
            "metrics": metrics, "repetition": next((r["repetition"] for r in results if r["repetition"]), None),
            "marker_interval_s": seqs[0].mm_state.get("marker_interval_s"), "parse_issues": issues,
            "sections": [{"start": a, "end": b} for a, b in plan]}
