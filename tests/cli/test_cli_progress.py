"""The terminal progress of ``diarist transcribe`` and ``diarist eval``: drawn on stderr when it is a terminal
(a real pseudo-terminal here), never when it is not or with ``--quiet``; stdout is byte for byte the same."""

from __future__ import annotations

import fcntl
import io
import os
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from cli.main import main
from cli.progress import EvalProgress, RemainingColumn, TranscribeProgress, shows_progress
from tests.conftest import data_file

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal (for the in-process tests; the subprocess test uses a real pty)."""

    def isatty(self) -> bool:
        return True


def _transcribe(args: list[str], stderr_tty: bool) -> tuple[int, bytes, str]:
    """Run ``python -m cli transcribe ARGS`` with stdout on a pipe and stderr on a pseudo-terminal (120
    columns) or a pipe; returns (status, stdout bytes, stderr text without ANSI control sequences)."""
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(REPO)}
    env.pop("NO_COLOR", None)
    cmd = [sys.executable, "-m", "cli", "transcribe", *args]
    if not stderr_tty:
        p = subprocess.run(cmd, capture_output=True, env=env, cwd=REPO, timeout=600, check=False)
        return p.returncode, p.stdout, p.stderr.decode()
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    chunks: list[bytes] = []

    def drain() -> None:  # the pty's buffer is small: read while the child writes
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the slave side
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env, cwd=REPO)
        os.close(slave)
        out, _ = p.communicate(timeout=600)
        reader.join(30)
    finally:
        os.close(master)
    return p.returncode, out, ANSI.sub("", b"".join(chunks).decode(errors="replace"))


@pytest.mark.slow
def test_progress_is_drawn_on_a_terminal_and_stdout_is_unchanged():
    jfk = str(data_file("en_jfk_inaugural/jfk.flac"))
    status, out_tty, err_tty = _transcribe([jfk], stderr_tty=True)
    assert status == 0, err_tty
    status, out_pipe, err_pipe = _transcribe([jfk], stderr_tty=False)
    assert status == 0, err_pipe
    assert out_tty == out_pipe  # byte for byte
    assert b"ask not what your country" in out_pipe.lower()
    # on the terminal: the stage, audio seconds done of the total, elapsed, what is left, the final state
    assert "transcription" in err_tty and "s audio" in err_tty and "elapsed" in err_tty and "left" in err_tty
    final = [line for line in re.split(r"[\r\n]", err_tty) if line.startswith("done")]
    assert final and re.search(r"\b11/11 s audio elapsed \d+:\d\d:\d\d left 0:00:00", final[-1]), err_tty
    # not a terminal: no progress at all (jfk makes no warning either, so stderr is empty)
    assert err_pipe == ""


def test_quiet_draws_nothing_on_a_terminal(monkeypatch, whisper_engine):
    import engine as engine_pkg

    monkeypatch.setattr(engine_pkg, "Engine", lambda *_a, **_k: whisper_engine)  # the session's tiny.en
    jfk = str(data_file("en_jfk_inaugural/jfk.flac"))
    err, out = FakeTerminal(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["transcribe", jfk, "--quiet"]) == 0
    assert err.getvalue() == "" and "ask not" in out.getvalue().lower()


def test_shows_progress_only_on_a_terminal_without_quiet():
    assert shows_progress(False, FakeTerminal())
    assert not shows_progress(True, FakeTerminal())
    assert not shows_progress(False, io.StringIO())


def test_transcribe_progress_follows_the_events():
    """Stage labels, seconds done from segment ends (never back, short of full until ``finished``), the
    decoded duration replacing the header's."""
    term = FakeTerminal()
    with TranscribeProgress(term, duration=100.0) as p:
        task = p.progress.tasks[0]
        p("stage", {"stage": "decode"})
        p("queued", {"duration": 98.0})
        p("stage", {"stage": "speech_detection"})
        assert (task.description, task.total) == ("speech detection", 98.0)
        p("stage", {"stage": "transcription"})
        p("segment", {"start": 0.0, "end": 40.0, "text": "a"})
        p("segment", {"start": 10.0, "end": 30.0, "text": "b"})  # an earlier end does not move it back
        assert task.completed == 40.0
        p("segment", {"start": 40.0, "end": 98.0, "text": "c"})
        assert task.completed < 98.0 and not task.finished  # the speakers stage is still to come
        p("stage", {"stage": "speakers"})
        assert RemainingColumn().render(task).plain == "-:--:--"  # no audio seconds here: no estimate
        p("finished", {"finish_reason": "stop", "metrics": {}})
        assert task.completed == 98.0 and task.description == "done"
    text = ANSI.sub("", term.getvalue())
    assert "98/98 s audio" in text and "done" in text


def test_a_failed_transcription_leaves_no_bar():
    term = FakeTerminal()
    with TranscribeProgress(term, duration=5.0) as p:
        p("stage", {"stage": "decode"})
    assert not p.progress.tasks[0].visible


def test_eval_progress_counts_items_and_shows_the_running_figures():
    term = FakeTerminal()
    with EvalProgress(term) as p:
        p.start(2)
        p.item("  a.wav: rtf 0.100", "WER 10.0% cpWER 12.0% DER(c0.25) 5.0% RTF 0.100")
        p.item("  b.wav: rtf 0.200", "WER 8.0% cpWER 9.0% DER(c0.25) 4.0% RTF 0.150")
    text = ANSI.sub("", term.getvalue())
    assert "  a.wav: rtf 0.100\n" in text and "2/2" in text and "WER 8.0% cpWER 9.0%" in text
