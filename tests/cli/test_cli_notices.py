"""What the CLI tells its user: ``diarist transcribe`` says on stderr what the output format may not carry (a
transcript cut at the token budget is reported as such, ``max_new_tokens``, not a decoding loop; a complete
one says nothing), and ``--help`` texts are plain and written once."""

from __future__ import annotations

from pathlib import Path

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


def test_help_text_has_no_sphinx_markup():
    """``--help`` descriptions come from module docstrings: their reST/Sphinx markup is reduced to text."""
    from cli.commands import plain

    assert plain("see :mod:`engine_server.server` and ``x`` (:func:`a.b`)") == "see engine_server.server and x (a.b)"


def test_kv_dtype_help_is_the_settings_description():
    """``--kv-dtype``'s help on ``engine`` and ``transcribe`` is the ``DIARIST_KV_DTYPE`` setting's text (one
    home: what it says about FP8's speed and devices cannot drift between them)."""
    import argparse

    from cli.options import add_kv_dtype
    from diarist.settings import Settings

    p = argparse.ArgumentParser()
    add_kv_dtype(p)
    action = next(a for a in p._actions if a.dest == "kv_dtype")
    assert action.help.endswith(Settings.model_fields["kv_dtype"].description)
    assert list(action.choices) == ["auto", "fp8_e4m3"]
    for cmd in ("engine", "transcribe"):
        src = (Path(__file__).resolve().parents[2] / "cli" / "commands" / f"{cmd}.py").read_text()
        assert "add_kv_dtype(p)" in src and '"--kv-dtype"' not in src
