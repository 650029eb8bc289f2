"""Loop guard: end a sequence whose output repeats itself or outruns the audio it transcribes.

Greedy decoding can lock into a cycle (laughter "ha ha ha", music, silence) and run to the token cap,
holding a batch slot and KV for minutes (sglang-omni #975). Two checks run after each token, through
:attr:`engine.request.Sequence.stop_checker`; either ends the sequence with ``FinishReason.REPETITION``
and keeps the output so far:

1. **Periodic tail.** For each period ``p <= max_period`` the guard keeps the run length of trailing
   positions with ``tok[i] == tok[i - p]`` (updated in O(max_period) per token). The tail is a loop when
   that run plus ``p`` covers at least ``min_repeats`` copies of the pattern and at least ``min_span``
   tokens. Tokens are compared after ``canonical`` (MOSS-TD maps every digit to one class, so a segment
   that repeats with advancing timestamps still counts as a repeat).
2. **Token rate.** More than ``grace_tokens + max_tokens_per_audio_s * seconds`` output tokens, where
   ``seconds`` is the audio covered so far (``progress_fn``, e.g. the last timestamp emitted) or else the
   whole duration. Dense meetings need about 4.5 tokens per audio second (sgl-project/sglang-omni #1034).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.request import FinishReason, Sequence


class RepetitionGuard:
    """A per-sequence stop checker (keeps state: use one instance per sequence).

    Args:
        audio_s: audio duration (seconds) for the rate bound; ``None`` disables the rate check unless
            ``progress_fn`` is given.
        max_period: longest repeating pattern looked for (tokens).
        min_repeats: copies of the pattern needed.
        min_span: tokens the repeated tail must cover at least.
        max_tokens_per_audio_s: rate bound (output tokens per audio second).
        grace_tokens: tokens always allowed on top of the rate bound.
        canonical: maps a token id to its comparison class (identity when ``None``).
        progress_fn: ``(seq) -> seconds | None``, audio covered so far; replaces ``audio_s`` in the rate
            bound (capped at ``audio_s`` when that is given) once it returns a number.

    After a stop, ``loop_start`` is the output index where the repeated tail begins and ``period`` its
    period (``None`` for a rate stop).
    """

    def __init__(self, audio_s: float | None = None, *, max_period: int = 64, min_repeats: int = 4,
                 min_span: int = 64, max_tokens_per_audio_s: float = 25.0, grace_tokens: int = 1024,
                 canonical: Callable[[int], int] | None = None,
                 progress_fn: Callable[[Sequence], float | None] | None = None) -> None:
        if max_period < 1 or min_repeats < 2:
            raise ValueError("max_period must be >= 1 and min_repeats >= 2")
        self.audio_s = audio_s
        self.max_period = max_period
        self.min_repeats = min_repeats
        self.min_span = min_span
        self.rate = max_tokens_per_audio_s
        self.grace = grace_tokens
        self.canonical = canonical
        self.progress_fn = progress_fn
        self._toks: list[int] = []
        self._run = [0] * (max_period + 1)  # _run[p]: trailing matches at lag p
        self.loop_start: int | None = None
        self.period: int | None = None
        self.reason: str | None = None

    def _push(self, tok: int) -> int | None:
        """Add one token; return the shortest looping period, if any."""
        toks = self._toks
        toks.append(self.canonical(tok) if self.canonical else tok)
        n = len(toks)
        found = None
        for p in range(1, min(self.max_period, n - 1) + 1):
            if toks[-1] == toks[-1 - p]:
                self._run[p] += 1
                span = self._run[p] + p
                if found is None and span >= max(self.min_span, self.min_repeats * p):
                    found = p
            else:
                self._run[p] = 0
        return found

    def __call__(self, seq: Sequence) -> FinishReason | None:
        out = seq.output_ids
        period = None
        for tok in out[len(self._toks):]:
            period = self._push(tok) or period
        if period is not None:
            self.period = period
            self.loop_start = len(out) - (self._run[period] + period)
            self.reason = f"output repeats a {period}-token pattern from token {self.loop_start}"
            return FinishReason.REPETITION
        seconds = self.audio_s
        covered = self.progress_fn(seq) if self.progress_fn is not None else None
        if covered is not None:
            seconds = covered if self.audio_s is None else min(covered, self.audio_s)
        if seconds is not None and len(out) > self.grace + self.rate * seconds:
            self.reason = (f"{len(out)} output tokens for {seconds:.1f} s of audio "
                           f"(bound {self.grace} + {self.rate:g}/s)")
            return FinishReason.REPETITION
        return None

    def kept_output(self, output_ids: list[int]) -> list[int]:
        """The output without the repeats: up to the end of the first copy of the looping pattern
        (all of it after a rate stop or no stop)."""
        if self.loop_start is None or self.period is None:
            return list(output_ids)
        return list(output_ids[: self.loop_start + self.period])
