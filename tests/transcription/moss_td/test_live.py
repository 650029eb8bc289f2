"""MOSS-TD output reaches listeners while it decodes: finished segments as they complete, clean text deltas
(never the ``[12.3][S01]`` markup), and the final result's segments not sent twice (issue 18 item 6)."""

from __future__ import annotations

import numpy as np

from engine import Engine, EngineConfig
from engine.loaders import LoadedModel
from engine.loaders.moss_td import ASSET_TOKENIZER
from engine.models.moss_td_prompt import build_prompt
from engine.tokenizer import TextTokenizer
from tests.transcription.scripted_model import EOS, ScriptedModel
from transcription.moss_td.pipeline import transcribe_moss

OUTPUT = "[0.52][S01]Morning, shall we start?[2.31][2.90][S02]Yes, the figures are ready.[5.04][5.40][S01]Great.[5.92]"


class Opts:
    max_new_tokens = None
    prompt = None


def test_segments_and_clean_text_stream_while_decoding():
    tok = TextTokenizer(ASSET_TOKENIZER)
    wave = np.zeros(8 * 16_000, dtype=np.float32)
    model = ScriptedModel(len(build_prompt(tok, wave.size, None, 2).ids), tok.encode(OUTPUT))
    info = {"name": "scripted", "family": "moss-td", "marker_every_s": 2, "eos_token_ids": (EOS,)}
    eng = Engine(EngineConfig(kv_budget_bytes=8 << 20, max_running_requests=2, stream_interval_s=0.0),
                 loaded=LoadedModel(model=model, tokenizer=tok, info=info))
    events: list[tuple[str, dict]] = []
    res = transcribe_moss(eng, wave, Opts(), lambda kind, payload: events.append((kind, payload)))
    deltas = [p["text"] for k, p in events if k == "delta"]
    segments = [(p["speaker"], p["start"], p["end"], p["text"]) for k, p in events if k == "segment"]
    assert segments == [("S01", 0.52, 2.31, "Morning, shall we start?"), ("S02", 2.9, 5.04, "Yes, the figures are ready."),
                        ("S01", 5.4, 5.92, "Great.")]
    assert [(s["speaker"], s["start"], s["end"], s["text"]) for s in res["segments"]] == segments
    assert "".join(deltas) == "Morning, shall we start? Yes, the figures are ready. Great."
    assert not any("[" in d or "]" in d for d in deltas)  # never the markup
    assert len(deltas) > 10  # streamed token by token, not at the end
    kinds = [k for k, _ in events]
    first_segment = kinds.index("segment")
    last_delta = len(kinds) - 1 - kinds[::-1].index("delta")
    assert first_segment < last_delta  # the first segment went out while the model was still decoding
    assert next(i for i, (k, p) in enumerate(events) if k == "delta" and "Great" in p["text"]) > first_segment
