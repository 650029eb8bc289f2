"""Segments of one Whisper window: its tokens cut into timed segments, with word times from the alignment
heads (:mod:`transcription.whisper.align`), and a failed window's tokens cut back to its last whole word."""

from __future__ import annotations

import math
from typing import Any

from engine.models.mel import HOP_LENGTH, N_FRAMES
from engine.request import Sequence
from transcription.audio import SAMPLE_RATE
from transcription.whisper.decoding import TIME_PRECISION, WhisperTokens, split_segments
from transcription.whisper.windows import Window


class WindowSegments:
    """Turns a Whisper window's decoded tokens into segments (absolute seconds) for one loaded model.

    ``model`` and ``tokenizer``: the engine's; ``tokens``: the model's special token ids;
    ``alignment_heads``: the cross-attention heads that give word times (none: no word times, no cut).
    """

    def __init__(self, model: Any, tokenizer: Any, tokens: WhisperTokens, alignment_heads: list) -> None:
        self.model, self.tokenizer, self.tokens, self.alignment_heads = model, tokenizer, tokens, alignment_heads

    def cut_at_word(self, seq: Sequence, ids: list[int], w: Window, limit_s: float
                    ) -> tuple[list[int], float] | None:
        """``ids`` up to the last aligned word that ends by ``limit_s`` (seconds into ``w``), closed by a
        timestamp token at that word's end, and that end; ``None`` without the attempt's encoder output."""
        enc = seq.mm_state.get("encoder")
        if enc is None or not self.alignment_heads:
            return None
        from transcription.whisper.align import align_words

        words = align_words(self.model, self.tokenizer, enc, seq.prompt_ids, ids,
                            self.alignment_heads, min(N_FRAMES, math.ceil(w.duration * (SAMPLE_RATE // HOP_LENGTH))))
        kept = [x for x in words if x["end"] <= limit_s]
        if not kept:
            return None
        n_text, end = sum(len(x["tokens"]) for x in kept), kept[-1]["end"]
        out, seen = [], 0
        for tok in ids:
            if seen == n_text:
                break
            out.append(tok)
            seen += tok < self.tokens.eot
        while out and out[-1] >= self.tokens.timestamp_begin:  # a segment closed just before: close it anew
            out.pop()
        step = min(round(end / TIME_PRECISION), round(30.0 / TIME_PRECISION))
        return [*out, self.tokens.timestamp_begin + step], step * TIME_PRECISION

    def words_end(self, seq: Sequence, ids: list[int], w: Window) -> float | None:
        """Seconds into ``w`` where the last aligned word of ``ids`` ends; ``None`` without the attempt's
        encoder output or without text."""
        enc = seq.mm_state.get("encoder")
        if enc is None or not self.alignment_heads:
            return None
        from transcription.whisper.align import align_words

        words = align_words(self.model, self.tokenizer, enc, seq.prompt_ids, ids, self.alignment_heads,
                            min(N_FRAMES, math.ceil(w.duration * (SAMPLE_RATE // HOP_LENGTH))))
        return max((x["end"] for x in words), default=None)

    def of_window(self, w: Window, seq: Sequence, output_ids: list[int], duration: float,
                  want_words: bool, split_characters: bool = False) -> list[dict]:
        """Segments (absolute seconds, clamped to ``[0, duration]``) of the tokens ``output_ids`` decoded
        from window ``w``, with aligned words when ``want_words`` and the attempt kept its encoder output
        (which is dropped here)."""
        tok = self.tokenizer
        out = []
        words_all: list[dict] = []
        enc = seq.mm_state.pop("encoder", None)
        if want_words and enc is not None and output_ids:
            try:
                from transcription.whisper.align import align_words
            except ImportError:
                align_words = None
            if align_words is not None:
                # mel frames of real audio (100 per second)
                n_frames = min(N_FRAMES, math.ceil(w.duration * (SAMPLE_RATE // HOP_LENGTH)))
                words_all = align_words(self.model, tok, enc, seq.prompt_ids, output_ids,
                                        self.alignment_heads, n_frames, split_characters=split_characters)
        for index, raw in enumerate(split_segments(self.tokens, output_ids, w.duration)):
            text = tok.decode(raw.token_ids).strip()
            if not text:
                continue
            s = min(max(w.start + raw.start, 0.0), duration)
            e = min(max(w.start + raw.end, s), duration)
            seg: dict[str, Any] = {"start": s, "end": e, "text": text}
            if words_all:
                words = [{"word": x["word"], "start": min(w.start + x["start"], duration),
                          "end": min(w.start + x["end"], duration)}
                         for x in words_all if x["segment"] == index]
                seg["words"] = words
            out.append(seg)
        return out
