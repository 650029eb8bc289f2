"""`diarist eval`'s per-language figures: items grouped by the language code of their folder, pooled as the
overall figures are."""

from __future__ import annotations

from pathlib import Path

from diarist.contract.result import TranscriptionResult
from evaluation.harness import evaluate, item_language
from tests.conftest import wav_bytes


def test_item_language_is_the_folder_code():
    assert item_language("zh_aishell1_BAC009S0724W0121/aishell-BAC009S0724W0121.wav") == "zh"
    assert item_language("ja_picovoice_test_ja/test_ja.wav") == "ja"
    assert item_language("multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3") == "other"
    assert item_language("music_brahms/x.ogg") == "other" and item_language("noise_x/empty.wav") == "other"


def test_by_language_pools_each_language_apart(tmp_path: Path):
    texts = {"en_a/a.wav": "one two three four", "zh_b/b.wav": "广州市房地产", "ja_c/c.wav": "知識が成立する"}
    hyps = {"a.wav": "one two three", "b.wav": "广州市房地", "c.wav": "知識が成立する"}
    for rel, text in texts.items():
        p = tmp_path / rel
        p.parent.mkdir()
        p.write_bytes(wav_bytes(1.0))
        p.with_suffix(".txt").write_text(text, encoding="utf-8")

    def fake(path: Path, **_hints) -> TranscriptionResult:
        return TranscriptionResult.from_json({"duration": 1.0, "language": "xx", "language_source": "detected", "model": "fake",
                "segments": [{"speaker": 0, "start": 0.0, "end": 1.0, "text": hyps[path.name]}],
                "finish_reason": "stop", "metrics": {}})

    report = evaluate(tmp_path, fake)
    by = report["by_language"]
    assert set(by) == {"en", "zh", "ja"}
    assert by["en"]["wer"] == 0.25 and by["en"]["items"] == 1  # one deletion in four words
    assert abs(by["zh"]["cer"] - 1 / 6) < 1e-9 and by["zh"]["wer"] is None  # characters, no WER
    assert by["ja"]["cer"] == 0.0
    rec = {r["id"]: r for r in report["items"]}
    assert rec["zh_b/b.wav"]["ref_language"] == "zh" and rec["zh_b/b.wav"]["language_source"] == "detected"
