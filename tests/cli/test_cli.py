"""The ``diarist`` command: bad input → one line on stderr and exit status 2; keys; subcommands."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from cli.main import build_parser, main
from tests.conftest import data_file


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("content", "code"), [(b"just some text\n" * 10, "decode_failed"), (b"", "empty_audio")])
def test_transcribe_bad_input_is_one_line_and_status_2(tmp_path, capsys, content, code):
    f = tmp_path / "input.wav"
    f.write_bytes(content)
    status, out, err = run_cli(capsys, "transcribe", str(f))
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"diarist: error: {code}: ")


def test_transcribe_missing_file(capsys, tmp_path):
    status, _out, err = run_cli(capsys, "transcribe", str(tmp_path / "nope.wav"))
    assert status == 2 and err.strip() == f"diarist: error: not_found: no such file: {tmp_path / 'nope.wav'}"


def test_transcribe_video_without_audio(tmp_path, capsys):
    from tests.api.test_errors import video_without_audio

    f = tmp_path / "v.mp4"
    f.write_bytes(video_without_audio())
    status, _out, err = run_cli(capsys, "transcribe", str(f))
    assert status == 2 and err.startswith("diarist: error: no_audio_stream: ") and err.count("\n") == 1


def test_installed_command_exit_status(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("not audio")
    p = subprocess.run([sys.executable, "-m", "cli", "transcribe", str(f)], capture_output=True, text=True,
                       timeout=300, check=False)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("diarist: error: decode_failed:") and p.stderr.count("\n") == 1


def test_subcommands_and_eval_hook():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {"serve", "demo", "transcribe", "keys", "migrate"} <= set(sub.choices)
    with pytest.raises(SystemExit) as e:
        main(["transcribe", "x.wav", "--format", "docx"])
    assert e.value.code == 2


def test_keys_create_list_revoke(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DIARIST_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("DIARIST_DATABASE_URL", raising=False)
    status, out, _ = run_cli(capsys, "keys", "create", "--name", "ci", "--admin", "--json")
    k = json.loads(out)
    assert status == 0 and k["token"].startswith("dia_") and k["webhook_secret"].startswith("whsec_") and k["admin"]
    status, out, _ = run_cli(capsys, "keys", "list")
    assert k["id"] in out and "admin" in out and k["token"] not in out
    assert run_cli(capsys, "keys", "revoke", k["id"])[0] == 0
    assert "revoked" in run_cli(capsys, "keys", "list")[1]
    assert run_cli(capsys, "keys", "revoke", k["id"])[0] == 2


@pytest.mark.slow
def test_transcribe_prints_speaker_lines(capsys, whisper_engine, monkeypatch):
    """The real thing on jfk.flac (reusing the session engine instead of loading a second one)."""
    import engine as engine_pkg

    monkeypatch.setattr(engine_pkg, "Engine", lambda *_a, **_k: whisper_engine)
    status, out, err = run_cli(capsys, "transcribe", str(data_file("en_jfk_inaugural/jfk.flac")), "--format", "txt")
    assert status == 0, err
    assert out.startswith("[0.") and " S01: " in out and "ask not what your country" in out.lower()
    for fmt in ("json", "verbose_json", "diarized_json", "srt", "vtt", "rttm"):  # each ends its last line
        status, out, err = run_cli(capsys, "transcribe", str(data_file("en_jfk_inaugural/jfk.flac")), "-f", fmt)
        assert status == 0 and out.endswith("\n") and not out.endswith("\n\n\n"), (fmt, out[-40:])


@pytest.mark.slow
def test_demo_command_end_to_end(tmp_path):
    """`diarist demo` as a user runs it (own process: the embedded stack owns process-wide Celery state)."""
    p = subprocess.run([sys.executable, "-m", "cli", "demo", "--data-dir", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "API listening on http://127.0.0.1:" in p.stdout
    lines = [x for x in p.stdout.splitlines() if x.startswith("[")]
    assert lines and all(re.fullmatch(r"\[\d+\.\d\d-\d+\.\d\d\] S0\d: .+", x) for x in lines)
    assert {x.split("] ")[1][:3] for x in lines} == {"S01", "S02"}


@pytest.mark.slow
def test_serve_embedded_answers_and_stops_on_sigterm(tmp_path):
    import os
    import signal

    import httpx

    from tests.servers import free_port, wait_port

    port = free_port()
    env = {**os.environ, "DIARIST_DATA_DIR": str(tmp_path / "d")}
    p = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--embedded", "--port", str(port)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_port(port, 300)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30)
        assert ready.status_code == 200 and ready.json()["checks"]["engine"] == "ok"
        bad = httpx.post(f"http://127.0.0.1:{port}/v1/jobs", files={"file": ("x.txt", b"text")}, timeout=30)
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "decode_failed"
        assert httpx.get(f"http://127.0.0.1:{port}/v1/jobs", timeout=30).status_code == 200  # auth off
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out[-2000:]
    assert f"listening on http://127.0.0.1:{port}" in out


def test_transcribe_directory_is_not_reported_missing(capsys, tmp_path):
    status, out, err = run_cli(capsys, "transcribe", str(tmp_path))
    assert status == 2 and out == ""
    assert err.startswith("diarist: error: not_a_file: ") and "no such file" not in err and err.count("\n") == 1


@pytest.mark.parametrize("hints", [["--num-speakers", "0"], ["--min-speakers", "-2"], ["--max-speakers", "0"],
                                   ["--min-speakers", "3", "--max-speakers", "2"], ["--num-speakers", "1000000"],
                                   ["--num-speakers", "2", "--max-speakers", "1"],
                                   ["--num-speakers", "2", "--min-speakers", "3"]])
def test_transcribe_bad_speaker_hints_are_one_line_and_status_2(capsys, hints, monkeypatch):
    import engine

    def no_engine(*a, **k):
        raise AssertionError("the model must not load for invalid speaker hints")

    monkeypatch.setattr(engine, "Engine", no_engine)
    status, out, err = run_cli(capsys, "transcribe", str(data_file("en_jfk_inaugural/jfk.mp3")), *hints)
    assert status == 2 and out == ""
    assert err.startswith("diarist: error: invalid_request: ") and err.count("\n") == 1


@pytest.mark.parametrize("value", ["0", "-5", "ten"])
def test_transcribe_a_budget_below_one_token_is_refused_before_the_model_loads(capsys, monkeypatch, value):
    """``--max-new-tokens`` takes an integer >= 1: 0 used to run with the default budget (it read as unset)
    and -5 to print an empty transcript with status 0."""
    import engine

    def no_engine(*a, **k):
        raise AssertionError("the model must not load for an invalid budget")

    monkeypatch.setattr(engine, "Engine", no_engine)
    with pytest.raises(SystemExit) as e:
        main(["transcribe", str(data_file("en_jfk_inaugural/jfk.mp3")), "--max-new-tokens", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("diarist transcribe: error: argument --max-new-tokens: ")


def test_transcribe_a_bad_setting_is_invalid_setting_not_bad_model(capsys, monkeypatch):
    """A ``DIARIST_*`` value that does not validate is ``invalid_setting`` naming the variable, as in every
    other command (it used to be caught with the engine's errors and printed as ``bad_model``)."""
    import engine

    def no_engine(*a, **k):
        raise AssertionError("the model must not load with invalid settings")

    monkeypatch.setattr(engine, "Engine", no_engine)
    monkeypatch.setenv("DIARIST_KV_DTYPE", "bogus")
    status, out, err = run_cli(capsys, "transcribe", str(data_file("en_jfk_inaugural/jfk.mp3")))
    assert status == 2 and out == ""
    assert err == ("diarist: error: invalid_setting: DIARIST_KV_DTYPE: Input should be 'auto' or 'fp8_e4m3' "
                   "(got 'bogus')\n")


@pytest.mark.slow
def test_demo_with_a_bad_file_is_one_line_not_a_traceback(tmp_path):
    f = tmp_path / "notes.wav"
    f.write_text("not audio")
    p = subprocess.run([sys.executable, "-m", "cli", "demo", "--file", str(f), "--data-dir",
                        str(tmp_path / "d")], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("diarist: error: decode_failed: ")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "tpu"])
@pytest.mark.parametrize("command", ["transcribe", "eval", "engine", "serve", "demo"])
def test_a_device_that_is_not_there_is_one_line_and_status_2(tmp_path, capsys, monkeypatch, command, device):
    monkeypatch.setenv("DIARIST_DATA_DIR", str(tmp_path / "data"))
    argv = {"transcribe": ["transcribe", str(data_file("en_short_yes/yes_1000ms.wav"))],
            "eval": ["eval", str(data_file("en_short_yes/yes.txt").parent), "--out", str(tmp_path / "r.json")],
            "engine": ["engine", "--port", "0"],
            "serve": ["serve", "--embedded", "--port", "0"],
            "demo": ["demo"]}[command]
    status, _out, err = run_cli(capsys, *argv, "--device", device)
    assert status == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("diarist: error:")]
    assert len(lines) == 1 and f"device_unavailable: device '{device}'" in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "data" / "diarist.sqlite3").exists()  # nothing opened before the engine failed


def test_engine_refuses_an_unknown_model_family_in_one_line():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "cli", "engine", "--model", "mossy"], check=False,
                          capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "invalid choice: 'mossy'" in proc.stderr and "Traceback" not in proc.stderr


def test_engine_on_a_port_in_use_is_one_line_before_the_model_loads(capsys):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        # moss-td without a checkpoint would fail while loading: the port is refused before that
        status, out, err = run_cli(capsys, "engine", "--model", "moss-td", "--host", "127.0.0.1",
                                   "--port", str(port))
    assert status == 2 and out == "", err
    assert err.startswith(f"diarist: error: address_in_use: cannot listen on 127.0.0.1:{port}") and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["migrate"], ["keys", "list"]], ids=["migrate", "keys"])
def test_a_database_that_does_not_answer_is_one_line_and_status_1(capsys, monkeypatch, argv):
    """Postgres down (nothing listens on its port): ``database_unavailable`` on one line, no traceback, exit 1
    (a dependency down, not bad input); ``migrate`` names the database without its password."""
    import logging

    from tests.servers import free_port

    # as in a fresh process: no root handler left by an earlier test on a capture stream that is now closed
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    port = free_port()
    monkeypatch.setenv("DIARIST_DATABASE_URL", f"postgresql+psycopg://diarist:s3cret@127.0.0.1:{port}/diarist")
    status, out, err = run_cli(capsys, *argv)
    assert status == 1 and out == "", err
    assert err.count("\n") == 1 and "Traceback" not in err and "s3cret" not in err
    assert err.startswith("diarist: error: database_unavailable: ")
    assert f'connection to server at "127.0.0.1", port {port} failed: Connection refused' in err
    assert "sqlalche.me" not in err  # the driver's reason, not SQLAlchemy's wrapper text
    if argv == ["migrate"]:
        assert err.startswith(f"diarist: error: database_unavailable: cannot reach the database at "
                              f"127.0.0.1:{port}/diarist: connection failed: ")


def test_a_bug_is_still_a_traceback(monkeypatch):
    """Only an outage (diarist.outages.classify) becomes the one line: any other error propagates."""
    import diarist.db

    def broken(*_a, **_k):
        raise KeyError("not an outage")

    monkeypatch.setattr(diarist.db, "upgrade", broken)
    with pytest.raises(KeyError):
        main(["migrate"])


def test_engine_does_not_answer_before_it_is_ready(monkeypatch):
    """The port probe is released before the model loads: while it loads, a connection is refused, so a
    deployment that waits for the port (compose, the tests' wait_port) still waits for a ready engine."""
    import errno
    import socket

    seen = {}

    class Loaded(Exception):
        pass

    def fake_engine(config):  # the moment the model would load
        with socket.socket() as probe:
            seen["connect"] = probe.connect_ex(("127.0.0.1", seen["port"]))
        raise Loaded

    with socket.socket() as s:  # a free port to ask for
        s.bind(("127.0.0.1", 0))
        seen["port"] = s.getsockname()[1]
    monkeypatch.setattr("engine.Engine", fake_engine)
    with pytest.raises(Loaded):
        main(["engine", "--host", "127.0.0.1", "--port", str(seen["port"]), "--device", "cpu"])
    assert seen["connect"] == errno.ECONNREFUSED
