"""MOSS-TD prompt: ChatML ids, audio token counts, time markers (2 s and 5 s), split tokenization."""

from __future__ import annotations

import json

import pytest

from engine.loaders.moss_td import ASSET_TOKENIZER
from engine.models.moss_td_prompt import (
    DEFAULT_INSTRUCTION,
    audio_span_ids,
    build_prompt,
    read_marker_interval,
    render_chat,
    window_token_counts,
)
from engine.tokenizer import TextTokenizer

AUDIO = 151671
DIGITS = list(range(15, 25))  # "0".."9" in Qwen3


@pytest.fixture(scope="module")
def tok():
    return TextTokenizer(ASSET_TOKENIZER)


def test_rendered_chat_encodes_to_the_published_ids(tok):
    # Ids of the whole prompt with one pad and the user text "请将音频转写为文本", as the slow
    # Qwen2Tokenizer of Qwen3-0.6B encodes them.
    expected = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 151669,
                151671, 151670, 198, 14880, 44063, 111268, 46670, 61443, 17714, 108704, 151645, 198, 151644,
                77091, 198]
    assert tok.encode(render_chat("请将音频转写为文本")) == expected


@pytest.mark.parametrize("samples,counts", [
    (1, [1]), (1280, [1]), (1281, [2]), (16_000, [13]), (480_000, [375]), (480_001, [375, 1]),
    (75 * 16_000, [375, 375, 188]), (0, []),
])
def test_window_token_counts(samples, counts):
    assert window_token_counts(samples) == counts


def _markers(span: list[int]) -> list[tuple[int, int]]:
    """(audio tokens before the marker, marker seconds) for each digit run in ``span``."""
    out, pads, digits = [], 0, ""
    for t in span + [AUDIO]:
        if t == AUDIO:
            if digits:
                out.append((pads, int(digits)))
                digits = ""
            pads += 1
        else:
            assert t in DIGITS
            digits += str(t - 15)
    return out


@pytest.mark.parametrize("every,per_marker", [(2, 25), (5, 62)])
def test_markers_are_absolute_seconds_across_windows(every, per_marker):
    n = sum(window_token_counts(75 * 16_000))  # three windows: 375 + 375 + 188
    span = audio_span_ids(n, AUDIO, DIGITS, every)
    assert span.count(AUDIO) == n == 938
    marks = _markers(span)
    # every multiple of the interval up to int(938 / 12.5) = 75 s, after int(12.5 * every) tokens each
    assert [s for _, s in marks] == list(range(every, 76, every))
    assert [p for p, _ in marks] == [per_marker * (s // every) for _, s in marks]
    assert marks[-1][1] > 30  # markers continue across windows instead of restarting at each one


@pytest.mark.parametrize("seconds,every,digits", [
    (30, 2, 26), (600, 2, 847), (5400, 2, 10_248),  # digits of the markers at every 2 s (30 s: 1 x 4 + 2 x 11)
    (30, 5, 11), (600, 5, 1 * 1 + 18 * 2 + 101 * 3), (1.9, 2, 0),
])
def test_marker_digit_counts(seconds, every, digits):
    n = sum(window_token_counts(int(seconds * 16_000)))
    span = audio_span_ids(n, AUDIO, DIGITS, every)
    assert len(span) - n == digits


def test_markers_disabled():
    assert audio_span_ids(400, AUDIO, DIGITS, None) == [AUDIO] * 400
    assert audio_span_ids(400, AUDIO, DIGITS, 0) == [AUDIO] * 400


def test_build_prompt_splits_at_the_pad_and_encodes_each_side(tok):
    p = build_prompt(tok, 45 * 16_000, "Transcribe with speakers.", marker_every_s=5)
    before = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
              "<|audio_start|>")
    after = "<|audio_end|>\nTranscribe with speakers.<|im_end|>\n<|im_start|>assistant\n"
    span = audio_span_ids(p.num_audio, AUDIO, DIGITS, 5)
    assert p.window_tokens == [375, 188] and p.num_audio == 563
    assert p.ids == tok.encode(before) + span + tok.encode(after)
    assert p.ids.count(AUDIO) == 563
    assert tok.decode(p.ids[-5:], skip_special_tokens=False) == "<|im_end|>\n<|im_start|>assistant\n"


def test_default_instruction_when_none_or_blank(tok):
    a = build_prompt(tok, 16_000, None)
    b = build_prompt(tok, 16_000, "   ")
    assert a.ids == b.ids
    assert DEFAULT_INSTRUCTION in tok.decode(a.ids, skip_special_tokens=False)


def test_marker_interval_read_from_processor_config(tmp_path):
    assert read_marker_interval(None) is None
    assert read_marker_interval(tmp_path) is None  # no file: nothing stated (the loader warns and decides)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"feature_size": 80}))
    assert read_marker_interval(tmp_path) is None
    (tmp_path / "processor_config.json").write_text(json.dumps({"time_marker_every_seconds": 5}))
    assert read_marker_interval(tmp_path) == (5, "processor_config.json")
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"processor": {"time_marker_every_seconds": 3}}))
    assert read_marker_interval(tmp_path) == (3, "processor_config.json")
    (tmp_path / "processor_config.json").write_text(json.dumps({"enable_time_marker": False}))
    assert read_marker_interval(tmp_path) == (0, "processor_config.json")
