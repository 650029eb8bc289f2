"""MOSS-TD after a loop: resume decoding after the last complete segment, within the request's budget.

MOSS-TD decodes a whole recording as one sequence, so a loop the guard stops (``[S01]yeah[..][..]...``)
would end the transcript there. Instead the output is cut after its last complete segment
(``[start][Sxx]text[end]``) before the loop, and decoding continues from there: a new sequence whose
prompt is the original prompt plus those tokens (the audio and its tokens unchanged), with the output
budget the request has left. Greedy decoding from the same tokens would walk into the same loop, so
continuations sample at the temperatures of ``transcription.decode_quality`` after the first decode's (0.2,
0.4, ... 1.0 after greedy; from a request's ``temperature`` + 0.2 up; fixed seed), one per resume, until one ends without a loop, the budget left is too small, or the
temperatures are spent. The transcript keeps the last cut plus what the last continuation added (when
that still looped: up to its last complete segment).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.engine import Engine
from engine.request import FinishReason, Sequence
from engine.sampling import SamplingParams
from transcription.decode_quality import FALLBACK_SEED, TEMPERATURES
from transcription.repetition import RepetitionGuard

RESUME_TEMPERATURES = TEMPERATURES[1:]
"""One continuation per temperature, in turn (greedy would repeat the loop)."""

MIN_RESUME_TOKENS = 64
"""A continuation needs at least this much budget left to be worth its prefill (tokens)."""

_CANDIDATES = 64  # closing brackets tried from the end when looking for the last complete segment
_CLOSES_TEXT = re.compile(r"[^\]\s]\s*\[\d+(?:\.\d*)?\]$")  # text, then its end time: "...morning.[2.00]"


def complete_prefix(tokenizer, ids: list[int]) -> int:
    """How many leading ``ids`` end with the last complete segment (a closing ``[end]`` bracket after a
    segment's text, possibly with the next ``[`` in the same token); 0 when no segment is complete."""
    from transcription.moss_td.parser import parse_moss_td

    closers = [i + 1 for i, t in enumerate(ids) if "]" in tokenizer.decode([t])]
    for n in reversed(closers[-_CANDIDATES:]):
        # a token may join the end bracket and the next one ("][" ): the continuation then writes its time
        text = tokenizer.decode(ids[:n], skip_special_tokens=True).rstrip().removesuffix("[")
        if _CLOSES_TEXT.search(text) and (segs := parse_moss_td(text)) and segs[-1].get("end") is not None:
            return n
    return 0


@dataclass
class Resumed:
    """The outcome of a MOSS-TD request after its resumes: ``output_ids`` (the kept tokens, loop tails
    cut), ``finish_reason`` (the last sequence's), ``repetition`` (the last guard's reason, if it
    stopped), ``sequences`` (the first and every continuation) and ``resumes`` (continuations run)."""

    output_ids: list[int]
    finish_reason: FinishReason | None
    repetition: str | None
    sequences: list[Sequence] = field(default_factory=list)
    resumes: int = 0


def _kept(seq: Sequence) -> list[int]:
    guard = seq.stop_checker
    if seq.finish_reason == FinishReason.REPETITION and isinstance(guard, RepetitionGuard):
        return guard.kept_output(seq.output_ids)
    return list(seq.output_ids)


def _reason(seq: Sequence) -> str | None:
    guard = seq.stop_checker
    return guard.reason if isinstance(guard, RepetitionGuard) and seq.finish_reason == FinishReason.REPETITION \
        else None


def resume_after_loops(engine: Engine, first: Sequence, wave: np.ndarray, make_guard: Callable[[], object],
                       should_cancel: Callable[[], bool] | None = None,
                       on_event: Callable[[Sequence, str, object], None] | None = None,
                       temperatures: tuple[float, ...] = RESUME_TEMPERATURES) -> Resumed:
    """Continue ``first`` (finished) after each loop stop, as the module docstring says.

    Args:
        first: the finished MOSS-TD sequence (``build_moss_sequence``); its budget is the request's.
        wave: its audio (float32 ``[n]`` 16 kHz), fed again with every continuation's prompt.
        make_guard: a new loop guard for a continuation (``RepetitionGuard`` with the request's settings).
        on_event: the listener each continuation streams through.
        temperatures: one continuation's temperature per resume, in turn (after ``first``'s:
            ``temperature_schedule(t)[1:]``).
    """
    out = Resumed(_kept(first), first.finish_reason, _reason(first), [first])
    budget = first.max_new_tokens
    for temperature in temperatures:
        if out.finish_reason != FinishReason.REPETITION or (should_cancel is not None and should_cancel()):
            break
        n = complete_prefix(engine.tokenizer, out.output_ids)
        left = budget - n
        if left < MIN_RESUME_TOKENS:
            break
        cont = Sequence(prompt_ids=[*first.prompt_ids, *out.output_ids[:n]], max_new_tokens=left,
                        stop_token_ids=first.stop_token_ids,
                        mm_inputs={"audio": torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))},
                        stop_checker=make_guard(), on_event=on_event, admission_class=first.admission_class,
                        mm_state={k: first.mm_state[k] for k in ("duration_s", "num_audio_tokens", "marker_interval_s")
                                  if k in first.mm_state},
                        sampling=SamplingParams(temperature=temperature, seed=FALLBACK_SEED))
        engine.submit(cont)
        engine.run_until_done([cont], should_cancel=should_cancel)
        out.sequences.append(cont)
        out.resumes += 1
        if cont.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
            out.finish_reason = cont.finish_reason
            break
        out.output_ids = [*out.output_ids[:n], *_kept(cont)]
        out.finish_reason, out.repetition = cont.finish_reason, _reason(cont)
    if out.finish_reason == FinishReason.REPETITION and (n := complete_prefix(engine.tokenizer, out.output_ids)):
        out.output_ids = out.output_ids[:n]  # still looping: keep the complete segments, not the loop's start
    return out
