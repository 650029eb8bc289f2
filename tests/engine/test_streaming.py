"""Streaming: incremental detokenization never splits a character; deltas are coalesced; event order."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from engine.loaders import bundled_whisper_dir
from engine.streaming import DeltaCoalescer, IncrementalDetokenizer
from engine.tokenizer import TextTokenizer
from tests.conftest import data_file

TEXTS = ["会议从九点开始，我们先讨论预算。", "こんにちは、今日はいい天気ですね。", "Launch 🚀🎉 with 👩‍👩‍👧 and 🇯🇵!",
         "naïve café — déjà vu", "mixed 中文 English 日本語 😀"]


def byte_level_tokenizers() -> list[TextTokenizer]:
    toks = [TextTokenizer(bundled_whisper_dir() / "tokenizer.json")]
    qwen = Path(__file__).resolve().parents[2] / "engine" / "assets" / "qwen3" / "tokenizer.json"
    if qwen.is_file():
        toks.append(TextTokenizer(qwen))
    return toks


def byte_token_ids(tok: TextTokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte (byte-level BPE has a token for each byte), so a split falls inside every
    multi-byte character."""
    # GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to 256 + n.
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    ids = [tok.token_to_id(table[b]) for b in text.encode("utf-8")]
    assert None not in ids
    return ids


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_are_whole_characters_at_every_byte_split(text):
    for tok in byte_level_tokenizers():
        ids = byte_token_ids(tok, text)
        d = IncrementalDetokenizer(tok.decode)
        deltas = [d.push(i) for i in ids] + [d.flush()]
        assert all("\ufffd" not in x for x in deltas)
        assert "".join(deltas) == text
        # A delta appears exactly when a character completes: never more pieces than characters.
        assert sum(1 for x in deltas if x) <= len(text)


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_from_real_tokenization_concatenate_to_the_decode(text):
    for tok in byte_level_tokenizers():
        ids = tok.encode(text)
        d = IncrementalDetokenizer(tok.decode)
        out = "".join(d.push(i) for i in ids) + d.flush()
        assert out == tok.decode(ids) == text


def test_flush_releases_an_incomplete_tail():
    tok = byte_level_tokenizers()[0]
    ids = byte_token_ids(tok, "ok 😀")[:-1]  # the emoji's last byte never arrives
    d = IncrementalDetokenizer(tok.decode)
    assert "".join(d.push(i) for i in ids) == "ok "
    assert d.flush() == "\ufffd"


def test_coalescer_first_at_once_then_windows():
    now = [0.0]
    c = DeltaCoalescer(0.05, clock=lambda: now[0])
    assert c.push("a") == "a"  # the first delta goes out at once
    now[0] = 0.01
    assert c.push("b") is None
    now[0] = 0.03
    assert c.push("c") is None
    now[0] = 0.061
    assert c.push("d") == "bcd"
    now[0] = 0.07
    assert c.push("e") is None
    assert c.flush() == "e" and c.flush() is None


@pytest.mark.slow
def test_event_stream_order_and_content(whisper_engine):
    from transcription.transcriber import TranscribeOptions, Transcriber

    tr = Transcriber(whisper_engine)

    async def collect():
        return [e async for e in stream_transcription(tr, data_file("en_jfk_inaugural/jfk.flac"),
                                                      TranscribeOptions(diarize=False))]

    events = asyncio.run(collect())
    from diarist.contract.events import STAGES

    stages = [e["stage"] for e in events if e["type"] == "stage"]
    assert stages and stages == sorted(stages, key=STAGES.index)  # each stage once, in the pipeline's order
    kinds = [e["type"] for e in events if e["type"] != "stage"]
    assert kinds[0] == "queued" and kinds[1] == "started" and kinds[-2:] == ["finished", "result"]
    assert kinds.index("delta") < kinds.index("segment")
    text = "".join(e["text"] for e in events if e["type"] == "delta")
    segs = [e for e in events if e["type"] == "segment"]
    assert " ".join(s["text"] for s in segs).split() == text.split()
    assert "ask not what your country can do for you" in text
    m = events[-2]["metrics"]
    for key in ("queue_wait_s", "encoder_s", "prefill_s", "decode_s", "prompt_tokens", "output_tokens", "rtf"):
        assert key in m
    assert m["output_tokens"] > 10 and m["decode_s"] > 0 and 0 < m["rtf"]
    json.dumps(events[-1]["result"])  # JSON-able


def test_no_tokens_are_streamed_during_chunked_prefill():
    import torch

    from engine import Sequence
    from tests.engine.test_engine_scheduling import TINY_MEL, tiny_engine

    eng = tiny_engine(chunk_size=8)
    seen = []
    s = Sequence(prompt_ids=list(range(1, 60)), max_new_tokens=3, mm_inputs={"mel": torch.randn(*TINY_MEL)},
                 ignore_eos=True, on_event=lambda seq, kind, p: seen.append((kind, seq.prefill_done)))
    eng.generate([s])
    tokens = [done for kind, done in seen if kind == "token"]
    assert len(tokens) == 3 and all(tokens)
    assert eng.counters["steps"] >= 59 // 8 + 3


async def stream_transcription(transcriber, source, options=None):
    """The test's event consumer: run a transcription on a worker thread and yield its events as they happen.

    Yields dicts ``{"type": kind, **payload}`` with kinds ``queued``, ``started``, ``delta`` ({text}),
    ``segment`` ({start, end, text}), ``finished`` ({metrics, finish_reason}) and finally ``result``
    ({result}: the JSON form of what :meth:`Transcriber.transcribe` returns) or ``error`` ({code, message}).
    Cancelling the iterator does not stop the engine work already submitted.
    """
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[dict | None] = asyncio.Queue()

    def on_event(kind: str, payload: dict) -> None:
        loop.call_soon_threadsafe(q.put_nowait, {"type": kind, **payload})

    def work() -> None:
        try:
            result = transcriber.transcribe(source, options, on_event)
            loop.call_soon_threadsafe(q.put_nowait, {"type": "result", "result": result.to_json()})
        except Exception as e:  # noqa: BLE001 - reported as an event; the caller decides the HTTP status
            code = getattr(e, "code", "engine_error")
            loop.call_soon_threadsafe(q.put_nowait, {"type": "error", "code": code, "message": str(e)})
        finally:
            loop.call_soon_threadsafe(q.put_nowait, None)

    threading.Thread(target=work, name="diarist-transcribe", daemon=True).start()
    while (item := await q.get()) is not None:
        yield item
