"""Whisper's decoding rules: prompt layout, token suppression, timestamp rules, and segment parsing.

The timestamp rules are OpenAI whisper's ``ApplyTimestampRules`` (``whisper/decoding.py``), also implemented
by ``transformers.WhisperTimeStampLogitsProcessor``; suppression order follows both (blank-at-begin, the
checkpoint's suppress list, then timestamp rules), so greedy tokens equal ``WhisperForConditionalGeneration
.generate(return_timestamps=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.request import Sequence

TIME_PRECISION = 0.02
"""Seconds per timestamp token step (``<|0.00|>``, ``<|0.02|>`` ... ``<|30.00|>``)."""


@dataclass(frozen=True)
class WhisperTokens:
    """Special token ids of a Whisper vocabulary (English-only tiny.en values as defaults)."""

    eot: int = 50256
    sot: int = 50257
    sot_prev: int = 50360
    no_timestamps: int = 50362
    timestamp_begin: int = 50363
    english_only: bool = True
    transcribe: int = 50358
    translate: int = 50357
    language_base: int = 50259

    @property
    def no_speech(self) -> int:
        """``<|nocaptions|>`` (English-only) / ``<|nospeech|>`` (multilingual): the id before
        ``<|notimestamps|>`` in both vocabularies."""
        return self.no_timestamps - 1

    @classmethod
    def from_vocab(cls, vocab_size: int) -> WhisperTokens:
        """English-only checkpoints have 51864 ids, multilingual ones 51865 (one more language token)."""
        if vocab_size == 51864:
            return cls()
        return cls(eot=50257, sot=50258, sot_prev=50361, no_timestamps=50363, timestamp_begin=50364,
                   english_only=False, transcribe=50359, translate=50358,
                   language_base=50259)


FORCED_START = "start"
"""``seq.mm_state`` key of a multilingual window's :class:`WindowStart`."""


@dataclass(frozen=True)
class WindowStart:
    """How a multilingual window's decode begins: its prompt ends at ``<|startoftranscript|>`` and its first
    two output tokens are forced, the language then the task, so that the first step's logits are those at
    ``<|startoftranscript|>``: where OpenAI Whisper reads the no-speech probability
    (``whisper/decoding.py``: ``logits[:, sot_index]``) and detects the language (``detect_language``: a
    softmax over the language tokens' logits there). One encoder pass serves all three.

    Attributes:
        task_id: ``<|transcribe|>`` or ``<|translate|>``.
        language_id: the requested language's token, or ``None`` to take the most probable of
            ``detect_ids`` (int64 ``[languages]``) at the first step; the choice and its probability are
            recorded in ``seq.mm_state["language_id"]`` / ``["language_probability"]`` (``None`` when requested).
    """

    task_id: int
    language_id: int | None = None
    detect_ids: torch.Tensor | None = None

    tokens = 2
    """Output tokens forced before the transcript's own (language, task)."""

    def force(self, seq: Sequence, logits: torch.Tensor, step: int) -> torch.Tensor:
        """Logits that leave only the token forced at output position ``step`` (0 or 1) possible."""
        if step == 0:
            lang = self.language_id
            if lang is None:
                assert self.detect_ids is not None
                probs = torch.softmax(logits[self.detect_ids].float(), dim=-1)
                best = int(probs.argmax())
                lang = int(self.detect_ids[best])
                seq.mm_state["language_probability"] = min(1.0, float(probs[best]))
            seq.mm_state["language_id"] = lang
            tok = lang
        else:
            tok = self.task_id
        out = torch.full_like(logits, -float("inf"))
        out[tok] = 0.0
        return out


def forced_tokens(seq: Sequence) -> int:
    """How many of ``seq``'s first output ids were forced (:class:`WindowStart`), not decoded."""
    start = seq.mm_state.get(FORCED_START)
    return start.tokens if start is not None else 0


class WhisperTimestampRules:
    """Per-sequence logits processor: suppression and timestamp pairing rules on float32 ``[vocab]``.

    At a sequence's first step it also records the model's no-speech probability (softmax of the raw
    logits at ``<|nospeech|>``, as OpenAI Whisper reads it at ``<|startoftranscript|>``) in
    ``seq.mm_state["no_speech_prob"]``, when the prompt ends with ``<|startoftranscript|>``: English-only
    prompts, and multilingual ones whose language and task tokens are forced as the first two outputs
    (a :class:`WindowStart` in ``seq.mm_state[FORCED_START]``; the rules then apply from the third).

    Args:
        suppress_ids: ids always suppressed (the checkpoint's ``suppress_ids``).
        suppress_ids_begin: ids suppressed at the first sampled position (blank, EOT).
        max_initial_timestamp_index: largest first timestamp, in 0.02 s steps (50 = 1.0 s, as OpenAI).
    """

    def __init__(self, tokens: WhisperTokens, suppress_ids: list[int], suppress_ids_begin: list[int],
                 max_initial_timestamp_index: int = 50) -> None:
        self.t = tokens
        self.suppress = torch.tensor(sorted(set(suppress_ids)), dtype=torch.long)
        self.suppress_begin = torch.tensor(sorted(set(suppress_ids_begin)), dtype=torch.long)
        self.max_initial = max_initial_timestamp_index

    def __call__(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        t, out = self.t, seq.output_ids
        if not out and seq.prompt_ids and seq.prompt_ids[-1] == t.sot:
            seq.mm_state["no_speech_prob"] = float(torch.softmax(logits.float(), dim=-1)[t.no_speech])
        start: WindowStart | None = seq.mm_state.get(FORCED_START)
        if start is not None:
            if len(out) < start.tokens:
                return start.force(seq, logits, len(out))
            out = out[start.tokens :]
        x = logits.clone()
        neg = -float("inf")
        if not out:
            x[self.suppress_begin] = neg
        x[self.suppress] = neg
        x[t.no_timestamps] = neg
        last_ts = len(out) >= 1 and out[-1] >= t.timestamp_begin
        penult_ts = len(out) < 2 or out[-2] >= t.timestamp_begin
        if last_ts:
            if penult_ts:
                x[t.timestamp_begin :] = neg
            else:
                x[: t.eot] = neg
        stamps = [tok for tok in out if tok >= t.timestamp_begin]
        if stamps:
            floor = stamps[-1] if (last_ts and not penult_ts) else stamps[-1] + 1
            x[t.timestamp_begin : floor] = neg
        if not out:
            x[: t.timestamp_begin] = neg
            x[t.timestamp_begin + self.max_initial + 1 :] = neg
        logprobs = torch.log_softmax(x, dim=-1)
        if logprobs[t.timestamp_begin :].logsumexp(-1) > logprobs[: t.timestamp_begin].max():
            x[: t.timestamp_begin] = neg
        return x


def whisper_prompt(tokens: WhisperTokens, prompt_ids: list[int] | None = None, max_prompt: int = 223,
                   language_id: int | None = None, task_id: int | None = None, forced_start: bool = False
                   ) -> list[int]:
    """Decoder prompt: ``[<|startofprev|> prompt...] <|startoftranscript|>`` (English-only, timestamps on).

    Multilingual checkpoints add ``<|lang|><|task|>``: ``language_id`` (default ``<|en|>``) and ``task_id``
    (default ``<|transcribe|>``; :mod:`transcription.language` picks both), unless ``forced_start``: then
    the prompt ends at ``<|startoftranscript|>`` and a :class:`WindowStart` forces both as the first outputs.
    ``prompt_ids`` (previous text / vocabulary hints) are cut to their last ``max_prompt`` tokens (OpenAI
    uses half the 448-token context).
    """
    out: list[int] = []
    if prompt_ids:
        out = [tokens.sot_prev, *prompt_ids[-max_prompt:]]
    out.append(tokens.sot)
    if not tokens.english_only and not forced_start:
        out += [tokens.language_base if language_id is None else language_id,
                tokens.transcribe if task_id is None else task_id]
    return out


@dataclass
class RawSegment:
    """A decoded span inside one window: seconds relative to the window start, and its text token ids."""

    start: float
    end: float
    token_ids: list[int]


def split_segments(tokens: WhisperTokens, output_ids: list[int], window_s: float) -> list[RawSegment]:
    """Split Whisper output into segments at timestamp tokens.

    ``<|a|> text <|b|>`` pairs make segments; text after the last timestamp runs to ``window_s`` (the
    window's speech length). EOT and other special ids are dropped.
    """
    segs: list[RawSegment] = []
    start: float | None = None
    text: list[int] = []
    for tok in output_ids:
        if tok >= tokens.timestamp_begin:
            ts = (tok - tokens.timestamp_begin) * TIME_PRECISION
            if start is None:
                start = ts
            else:  # a closing timestamp; its twin (if any) opens the next segment
                if text:
                    segs.append(RawSegment(start, max(ts, start), text))
                text, start = [], None
        elif tok < tokens.eot:
            if start is None:
                start = segs[-1].end if segs else 0.0
            text.append(tok)
    if text:
        s0 = start if start is not None else 0.0
        segs.append(RawSegment(s0, max(window_s, s0), text))
    return segs
