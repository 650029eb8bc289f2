"""Word timestamps for Whisper from cross-attention alignment heads and dynamic time warping.

Method (Radford et al. 2022 and OpenAI whisper's ``timing.py``; written here from that description):
teacher-force ``sot-sequence <|notimestamps|> text <|endoftext|>`` through the decoder, take the
cross-attention logits of the checkpoint's alignment heads (the ``alignment_heads`` list of the model's
generation config, ``[layer, head]`` pairs), keep the encoder frames that hold real audio, softmax over
them, standardise each head over the token axis, median-filter along time (width 7), average the heads,
and find the monotonic token-to-frame path with DTW over the negated matrix. A token starts at the
first frame its row reaches on that path; a word starts where its first token starts and ends where the
next word (or the end-of-text row) starts. Encoder frames are 20 ms apart.
"""

from __future__ import annotations

import string

import numpy as np
import torch
import torch.nn.functional as F

from engine.models.mel import HOP_LENGTH, SAMPLE_RATE
from transcription.whisper.decoding import WhisperTokens, split_segments

FRAME_S = 2 * HOP_LENGTH / SAMPLE_RATE
"""Seconds per encoder frame (0.02: the encoder's stride-2 conv over 10 ms mel frames)."""
MIN_WORD_S = FRAME_S
"""Shortest word (seconds): one encoder frame, the alignment's resolution. DTW may enter several token
rows at one frame (short function words, a word right after a pause), which gave words with
``end == start``; every spoken word occupies at least the frame its first token is aligned to, and a finer
time is beyond what the alignment can tell."""
MEDIAN_WIDTH = 7
"""Median filter width in encoder frames (OpenAI's value)."""
_PUNCT = set(string.punctuation) | set("。，！？：”、")
_SENTENCE_END = set(".。!！?？")


@torch.inference_mode()
def cross_attention_logits(model, encoder_states: torch.Tensor, tokens: list[int],
                           heads: list[list[int]]) -> torch.Tensor:
    """Scaled cross-attention logits ``q k^T / sqrt(head_dim)`` of the given heads.

    Runs the decoder layers of ``model`` (our ``WhisperForConditionalGeneration``) on ``tokens`` with
    plain causal self-attention (no KV cache), up to the deepest layer named in ``heads``.

    Args:
        encoder_states: ``[1500, d_model]`` encoder output of the window.
        tokens: decoder input ids (``T`` of them, at most ``max_target_positions``).
        heads: ``[[layer, head], ...]``.
    Returns:
        float32 ``[len(heads), T, 1500]``.
    """
    dec = model.model.decoder
    dev, dtype = dec.embed_tokens.weight.device, dec.embed_tokens.weight.dtype
    ids = torch.tensor(tokens, device=dev)
    x = dec.embed_tokens(ids) + dec.embed_positions.weight[: len(tokens)]
    enc = encoder_states.to(dev, dtype)
    wanted: dict[int, list[int]] = {}
    for layer, head in heads:
        wanted.setdefault(int(layer), []).append(int(head))
    found: dict[tuple[int, int], torch.Tensor] = {}
    for i, layer in enumerate(dec.layers[: max(wanted) + 1]):
        a = layer.self_attn
        h = layer.self_attn_layer_norm(x)
        q, k, v = (a.split(p(h)).transpose(0, 1) for p in (a.q_proj, a.k_proj, a.v_proj))
        x = x + a.out_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).flatten(1))
        c = layer.encoder_attn
        q = c.split(c.q_proj(layer.encoder_attn_layer_norm(x))).transpose(0, 1).float()
        k, v = (c.split(p(enc)).transpose(0, 1).float() for p in (c.k_proj, c.v_proj))
        logits = q @ k.transpose(1, 2) / c.head_dim**0.5  # [heads, T, 1500]
        for hd in wanted.get(i, []):
            found[(i, hd)] = logits[hd]
        o = (logits.softmax(-1) @ v).transpose(0, 1).flatten(1).to(dtype)
        x = x + c.out_proj(o)
        x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
    return torch.stack([found[(int(layer), int(hd))] for layer, hd in heads])


def _median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window on the last axis, reflect-padded (keeps the length)."""
    if width <= 1 or x.shape[-1] <= width // 2:
        return x
    pad = width // 2
    shape = x.shape
    y = F.pad(x.reshape(-1, 1, shape[-1]), (pad, pad), mode="reflect").squeeze(1)
    return y.unfold(-1, width, 1).median(-1).values.reshape(shape)


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Monotonic minimum-cost path through ``cost`` ``[N, M]`` from (0, 0) to (N-1, M-1).

    Steps: diagonal, down (next row, same column), right (same row, next column). Computed one
    anti-diagonal at a time, so the work is vectorised over each diagonal.

    Returns:
        ``(rows, cols)``: int arrays of equal length, the path in order.
    """
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    step = np.zeros((n + 1, m + 1), np.int8)  # 0 diagonal, 1 from above, 2 from the left
    for s in range(2, n + m + 1):  # cells (i, j), 1-based, with i + j == s
        i = np.arange(max(1, s - m), min(n, s - 1) + 1)
        j = s - i
        cand = np.stack([acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]])
        best = cand.argmin(0)
        acc[i, j] = cost[i - 1, j - 1] + cand[best, np.arange(len(i))]
        step[i, j] = best
    rows, cols = [], []
    i, j = n, m
    while i > 0 and j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        b = step[i, j]
        if b == 0:
            i, j = i - 1, j - 1
        elif b == 1:
            i -= 1
        else:
            j -= 1
    return np.array(rows[::-1]), np.array(cols[::-1])


def _words(tokenizer, ids: list[int], split_characters: bool = False) -> list[tuple[str, int, int, int]]:
    """Group text tokens into words: ``(text, first token, end of the spoken part, end token)`` indices.

    A word starts at a piece whose text begins with a space (with ``split_characters``, for languages written
    without spaces, at every piece that is not punctuation, as OpenAI whisper's ``split_tokens_on_unicode``);
    other pieces (sub-words, trailing punctuation) join the word before them. Trailing punctuation is part of the word's text but not of
    its spoken part, so it does not stretch the word's end. Pieces are the shortest runs of tokens that
    decode to whole UTF-8 characters, so a multi-byte character split over tokens is never cut.
    """
    words: list[list] = []
    start = 0
    for end in range(1, len(ids) + 1):
        piece = tokenizer.decode(ids[start:end])
        if "\ufffd" in piece and end < len(ids):
            continue
        if not words or piece.startswith(" ") or (split_characters and not all(ch in _PUNCT for ch in piece)):
            words.append([piece, start, end, end])
        else:
            w = words[-1]
            w[0] += piece
            if not all(ch in _PUNCT for ch in piece):
                w[2] = end
            w[3] = end
        start = end
    return [(w, a, c, b) for w, a, c, b in words]


def _tidy(words: list[dict], segments: list, seg_of: list[int]) -> None:
    """Shorten words that absorbed a pause, then keep segment-edge words inside Whisper's timestamps.

    DTW gives the silence before a word after a pause (or after the last word before one) to that
    word. As OpenAI's timing code does, a word longer than twice the median word duration (median
    capped at 0.7 s) at a sentence or segment edge is cut to that length on its pause side; then the
    first and last word of each segment are clipped to the segment's own timestamps when those fall
    inside the word.
    """
    durs = [w["end"] - w["start"] for w in words if w["end"] > w["start"]]
    max_d = 2 * min(0.7, float(np.median(durs))) if durs else 0.0
    for i, w in enumerate(words):
        first = i == 0 or seg_of[i - 1] != seg_of[i] or words[i - 1]["word"].rstrip()[-1:] in _SENTENCE_END
        last = i == len(words) - 1 or seg_of[i + 1] != seg_of[i] or w["word"].rstrip()[-1:] in _SENTENCE_END
        if max_d and w["end"] - w["start"] > max_d:
            if first:
                w["start"] = w["end"] - max_d
            elif last:
                w["end"] = w["start"] + max_d
        seg = segments[seg_of[i]]
        if first and seg_of[i] != (seg_of[i - 1] if i else -1) and w["start"] < seg.start < w["end"]:
            w["start"] = seg.start
        if (i == len(words) - 1 or seg_of[i + 1] != seg_of[i]) and w["start"] < seg.end < w["end"]:
            w["end"] = seg.end


def align_words(model, tokenizer, encoder_states: torch.Tensor, prompt_ids: list[int], output_ids: list[int],
                alignment_heads: list[list[int]], num_frames: int, split_characters: bool = False) -> list[dict]:
    """Word timestamps for one decoded Whisper window.

    Args:
        model: our ``WhisperForConditionalGeneration``.
        tokenizer: the engine's ``TextTokenizer``.
        encoder_states: ``[1500, d_model]`` encoder output of the window (``seq.mm_state["encoder"]``).
        prompt_ids: the decoder prompt used for the window; only the part from ``<|startoftranscript|>`` on
            is used (previous-text context does not change where words are).
        output_ids: generated ids; timestamp tokens and ``<|endoftext|>`` are dropped.
        alignment_heads: ``[[layer, head], ...]`` from the checkpoint config.
        num_frames: mel frames (10 ms each) of real audio in the window (``ceil(seconds * 100)``).
        split_characters: words are single characters (token pieces), for text written without spaces
            (Chinese, Japanese, Thai, ...: :data:`transcription.language.CHARACTER_LANGUAGES`).
    Returns:
        ``[{"word", "start", "end", "tokens", "segment"}]`` in order, times in seconds from the window
        start, ``0 <= start < end <= num_frames / 100``, each word at least :data:`MIN_WORD_S` long (fewer
        only when the window cannot hold them all: :func:`keep_min_duration`), each start at or after the
        previous end;
        ``word`` keeps its leading space, ``tokens`` are its ids, ``segment`` is the index of its segment
        in ``split_segments(tokens, output_ids, num_frames / 100)``.
        Empty when there is no text. Raises ``ValueError`` when ``alignment_heads`` is empty.
    """
    if not alignment_heads:
        raise ValueError("the checkpoint lists no alignment heads")
    tt = WhisperTokens.from_vocab(model.config.vocab_size)
    text = [t for t in output_ids if t < tt.eot]
    if not text:
        return []
    sot = prompt_ids.index(tt.sot) if tt.sot in prompt_ids else 0
    lead = []  # language and task tokens a multilingual window's decoder was forced to output first
    for t in output_ids:
        if not tt.eot < t < tt.timestamp_begin:
            break
        lead.append(t)
    sot_seq = [*prompt_ids[sot:], *lead]
    room = model.config.max_target_positions - len(sot_seq) - 2
    text = text[:room]
    tokens = [*sot_seq, tt.no_timestamps, *text, tt.eot]
    n_audio = max(1, min(encoder_states.shape[0], num_frames // 2))
    logits = cross_attention_logits(model, encoder_states, tokens, alignment_heads)[:, :, :n_audio]
    w = logits.softmax(-1)
    std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)
    w = _median_filter((w - mean) / (std + 1e-10), MEDIAN_WIDTH)
    matrix = w.mean(0)[len(sot_seq) : -1]  # rows: the query that predicts each text token, then EOT
    rows, cols = dtw_path(-matrix.double().cpu().numpy())
    first = np.flatnonzero(np.diff(rows, prepend=-1))  # path index where each row is entered
    row_time = cols[first] * FRAME_S  # one entry per row, len(text) + 1
    limit = num_frames / 100
    segments = split_segments(tt, output_ids, limit)
    first_tok = np.cumsum([0] + [len(sg.token_ids) for sg in segments])
    out, seg_of = [], []
    for word, a, spoken, b in _words(tokenizer, text, split_characters):
        out.append({"word": word, "start": float(row_time[a]), "end": float(row_time[spoken]), "tokens": text[a:b]})
        seg_of.append(int(np.searchsorted(first_tok, a, side="right")) - 1)
    _tidy(out, segments, seg_of)
    keep_min_duration(out, MIN_WORD_S, 0.0, limit)
    for w, seg in zip(out, seg_of):
        w["start"], w["end"], w["segment"] = round(w["start"], 3), round(w["end"], 3), seg
    return out


def keep_min_duration(words: list[dict], min_s: float, lo: float, hi: float) -> None:
    """Give every word at least ``min_s`` seconds without overlapping its neighbours (in place).

    ``words``: ``[{"start", "end", ...}]`` in spoken order, seconds, to be kept in ``[lo, hi]`` (a window,
    a segment). A forward pass makes each word start at or after the previous word's end and last at least
    ``min_s`` (a word the alignment gave no time pushes the next one only as far as needed: a longer word
    absorbs the push); a backward pass brings words that the push moved past ``hi`` back inside. ``min_s``
    is lowered to ``(hi - lo) / len(words)`` when the words cannot all have it. Afterwards
    ``lo <= start < end <= next start`` and ``end <= hi`` (nothing changes when ``hi <= lo``).
    """
    if not words or hi <= lo:
        return
    min_s = min(min_s, (hi - lo) / len(words))
    prev = lo
    for w in words:
        w["start"] = min(max(w["start"], prev), hi)
        w["end"] = max(min(w["end"], hi), w["start"] + min_s)
        prev = w["end"]
    nxt = hi
    for w in reversed(words):
        w["end"] = min(w["end"], nxt)
        w["start"] = max(lo, min(w["start"], w["end"] - min_s))
        nxt = w["start"]
