"""One MOSS-TD request end to end: waveform -> :class:`Sequence` (prompt, budget, loop guard) -> result.

Usage (the engine must be loaded with ``EngineConfig(model="moss-td", ...)``)::

    seq = build_moss_sequence(engine, wave, max_new_tokens=None, prompt=None)
    engine.generate([seq])
    result = moss_result(seq, engine.tokenizer, duration=len(wave) / 16000)

Budget (sgl-project/sglang-omni #1034): unless the request sets ``max_new_tokens``,
:func:`transcription.limits.default_budget`; either way clamped to the context left after the prompt.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.models.mel import SAMPLE_RATE
from engine.models.moss_td_prompt import build_prompt
from engine.request import RequestRejected, Sequence
from engine.sampling import GREEDY, SamplingParams
from transcription.decode_quality import FALLBACK_SEED
from transcription.limits import default_budget
from transcription.repetition import RepetitionGuard

MIN_OUTPUT_TOKENS = 64  # a prompt that leaves less than this cannot give a useful transcript
GiB = 1 << 30


class TimestampProgress:
    """``(seq) -> seconds | None``: the largest bracketed number ``[12.34]`` in the output so far, read
    incrementally from per-token text pieces, for the loop guard's rate bound; ``None`` until the first
    one (output without timestamps, e.g. from a custom instruction, is then bounded by the duration)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._pieces: dict[int, str] = {}
        self._seen = 0
        self._inside: str | None = None
        self.seconds: float | None = None

    def _piece(self, tok: int) -> str:
        p = self._pieces.get(tok)
        if p is None:
            p = self._pieces[tok] = self.tokenizer.decode([tok])
        return p

    def __call__(self, seq: Sequence) -> float | None:
        for tok in seq.output_ids[self._seen:]:
            for ch in self._piece(tok):
                if ch == "[":
                    self._inside = ""
                elif self._inside is not None:
                    if ch == "]":
                        try:
                            self.seconds = max(self.seconds or 0.0, float(self._inside))
                        except ValueError:
                            pass
                        self._inside = None
                    elif (ch.isdigit() or ch == ".") and len(self._inside) < 32:
                        self._inside += ch
                    else:
                        self._inside = None
        self._seen = len(seq.output_ids)
        return self.seconds


def _digit_class(tok: int) -> int:
    return 15 if 15 <= tok <= 24 else tok  # Qwen3 digits "0".."9" are ids 15..24


def moss_guard(tokenizer, duration: float) -> RepetitionGuard:
    """The loop guard of a MOSS-TD sequence over ``duration`` seconds (digits count as one class; the rate
    bound follows the timestamps emitted)."""
    return RepetitionGuard(duration, canonical=_digit_class, progress_fn=TimestampProgress(tokenizer))


def build_moss_sequence(engine, wave: np.ndarray, max_new_tokens: int | None = None,
                        prompt: str | None = None, temperature: float | None = None) -> Sequence:
    """A MOSS-TD request for ``engine``.

    Args:
        wave: float32 ``[n]`` mono 16 kHz samples (the whole recording: one request, one context).
        max_new_tokens: output budget (tokens); ``None`` uses :func:`default_budget`.
        prompt: instruction text; ``None``/empty uses the released default instruction.
        temperature: ``None`` or 0: greedy, as the official code decodes; > 0: sampled at it with the
            fixed seed :data:`transcription.decode_quality.FALLBACK_SEED` (a request's ``temperature``).
    Returns:
        A :class:`Sequence` to ``engine.submit``; its ``stop_checker`` is a :class:`RepetitionGuard` and
        ``mm_state["duration_s"]`` the audio duration.
    Raises:
        RequestRejected: ``too_short`` (no samples), ``too_long`` (the prompt leaves fewer than
            ``MIN_OUTPUT_TOKENS`` of the context), ``kv_capacity`` (prompt + budget exceed the KV cache).
    """
    wave = np.asarray(wave, dtype=np.float32).reshape(-1)
    if wave.size == 0:
        raise RequestRejected("too_short", "the audio has no samples")
    duration = wave.size / SAMPLE_RATE
    info = engine.loaded.info
    marker = info["marker_every_s"]  # the loader always states it (and where it came from)
    p = build_prompt(engine.tokenizer, int(wave.size), prompt, marker, info.get("chat_template"))
    left = engine.max_context - len(p.ids)
    if left < MIN_OUTPUT_TOKENS:
        per_s = len(p.ids) / duration  # prompt tokens per audio second (audio, markers, template)
        fit_min = (engine.max_context - MIN_OUTPUT_TOKENS) / per_s / 60
        model_ctx = engine.model.max_context
        why = (f"this engine's max_context; the model allows {model_ctx}" if engine.max_context < model_ctx
               else "the official processor's limit")
        raise RequestRejected(
            "too_long", f"{duration / 60:.1f} min of audio makes a prompt of {len(p.ids)} tokens, which with "
                        f"at least {MIN_OUTPUT_TOKENS} output tokens exceeds the {engine.max_context}-token "
                        f"context ({why}; about {fit_min:.0f} min of audio fit)")
    rules = info.get("greedy_rules")
    if max_new_tokens is None:
        budget = default_budget(duration, rules.max_new_tokens if rules is not None else None)
    else:
        budget = int(max_new_tokens)
    budget = max(1, min(budget, left))
    need = len(p.ids) + budget
    slots = engine.allocator.num_slots
    if need > slots:
        per = engine.kv_bytes_per_token
        raise RequestRejected(
            "kv_capacity", f"{duration / 60:.1f} min of audio needs {need} KV tokens (prompt {len(p.ids)} + "
                           f"output budget {budget}) = {need * per / GiB:.2f} GiB, but the engine's KV cache "
                           f"holds {slots} tokens = {slots * per / GiB:.2f} GiB; give the engine more KV "
                           f"memory or set a smaller max_new_tokens")
    guard = moss_guard(engine.tokenizer, duration)
    sampling = SamplingParams(temperature=temperature, seed=FALLBACK_SEED) if temperature else GREEDY
    return Sequence(prompt_ids=p.ids, max_new_tokens=budget, sampling=sampling,
                    stop_token_ids=tuple(info.get("eos_token_ids", (151645,))),
                    mm_inputs={"audio": torch.from_numpy(wave)}, stop_checker=guard,
                    mm_state={"duration_s": duration, "num_audio_tokens": p.num_audio,
                              "marker_interval_s": marker})


def clamp_segment(seg: dict, duration: float) -> dict:
    """A copy of a parsed segment with its times clamped to ``duration`` (seconds; the model may write an end
    past the audio, sglang-omni #1034)."""
    seg = dict(seg)
    if duration > 0:
        seg["start"] = min(float(seg["start"]), duration)
        if seg.get("end") is not None:
            seg["end"] = min(float(seg["end"]), duration)
    return seg


def moss_result(seq: Sequence, tokenizer, duration: float, resumed=None) -> dict:
    """Decode and parse a finished MOSS-TD sequence (with ``resumed``, a
    :class:`transcription.moss_td.resume.Resumed`: its kept tokens, finish reason and loop reason instead
    of ``seq``'s, and ``output_tokens`` over all its sequences).

    Returns a dict: ``segments`` (``[{"speaker", "start", "end", "text"}]``, seconds, ends clamped to
    ``duration``), ``text`` (the decoded output, special tokens skipped, stripped), ``finish_reason``
    (``stop``/``length``/``repetition``/``abort``/``error``), ``coverage`` (last segment end, or start when
    it has no end, over ``duration``; 0 when nothing parsed), ``repetition`` (the guard's reason or
    ``None``), ``prompt_tokens``, ``output_tokens`` and ``parse_issues`` (what was malformed in the output:
    :class:`transcription.moss_td.parser.MossParse`). After a repetition stop the repeated tail is cut
    to its first copy.
    """
    from transcription.moss_td.parser import parse_moss_td_report

    ids = list(seq.output_ids)
    guard = seq.stop_checker if isinstance(seq.stop_checker, RepetitionGuard) else None
    if guard is not None and seq.finish_reason is not None and seq.finish_reason.value == "repetition":
        ids = guard.kept_output(ids)
    finish, repetition = seq.finish_reason, guard.reason if guard is not None else None
    output_tokens = len(seq.output_ids)
    if resumed is not None:
        ids, finish, repetition = resumed.output_ids, resumed.finish_reason, resumed.repetition
        output_tokens = sum(len(s.output_ids) for s in resumed.sequences)
    text = tokenizer.decode(ids, skip_special_tokens=True).strip()
    parsed = parse_moss_td_report(text)
    segments = [clamp_segment(s, duration) for s in parsed.segments]
    last = max((s["end"] if s.get("end") is not None else s["start"] for s in segments), default=0.0)
    return {
        "segments": segments,
        "text": text,
        "finish_reason": finish.value if finish is not None else None,
        "coverage": min(1.0, last / duration) if duration > 0 else 0.0,
        "repetition": repetition,
        "prompt_tokens": seq.prompt_len,
        "output_tokens": output_tokens,
        "error": seq.error,
        "parse_issues": parsed.issues,
    }
