"""``diarist transcribe`` says on stderr what the output format may not carry: a transcript cut at the
token budget is reported as such (``max_new_tokens``, not a decoding loop), a complete one says nothing."""

from __future__ import annotations

from cli.main import main
from tests.conftest import data_file


def test_a_truncated_transcript_is_reported_on_stderr(capsys, whisper_engine, monkeypatch):
    import engine as engine_pkg

    monkeypatch.setattr(engine_pkg, "Engine", lambda *_a, **_k: whisper_engine)  # the session's tiny.en
    jfk = str(data_file("en_jfk_inaugural/jfk.flac"))
    status = main(["transcribe", jfk, "--max-new-tokens", "3"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.startswith("[") and " S01: " in out  # the part that was decoded still comes out
    warnings = [line for line in err.splitlines() if line.startswith("diarist: warning: ")]
    expected = ("diarist: warning: max_new_tokens: decoding stopped at the token limit (max_new_tokens 3) in 1 "
                "window(s) (0.2-11.0 s); their segments are flagged 'max_new_tokens'")
    assert warnings == [expected], err
    assert "repetition" not in err

    status = main(["transcribe", jfk, "--format", "srt"])
    out, err = capsys.readouterr()
    assert status == 0 and "ask not what your country" in out.lower(), err
    assert "diarist: warning:" not in err
