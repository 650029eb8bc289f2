"""The listen-address check (cli/listen.py) of the serving commands: a taken port is one line and exit 2
before anything starts."""

from __future__ import annotations

import pytest

from cli.main import main


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch):
    """``serve`` configures logging on the test's capture stream: leave the root logger as it was."""
    import logging

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["serve", "serve --embedded", "demo"])
def test_serve_on_a_port_in_use_is_one_line_before_anything_starts(tmp_path, capsys, monkeypatch, command):
    """``diarist serve [--embedded]`` (and ``demo --port``) on a taken port: the one line and exit 2 of
    ``diarist engine``, before the stack (database, workers, engine) or uvicorn starts, rather than exit 3
    after startup."""
    import socket

    import uvicorn

    from cli.commands import stack

    def started(*_a, **_k):
        raise AssertionError("diarist serve started something on a port in use")

    monkeypatch.setattr(uvicorn, "run", started)
    monkeypatch.setattr(stack.EmbeddedStack, "start", started)
    monkeypatch.setenv("DIARIST_DATA_DIR", str(tmp_path / "data"))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        where = ["--port", str(port)] if command == "demo" else ["--host", "127.0.0.1", "--port", str(port)]
        status, out, err = run_cli(capsys, *command.split(), *where)
    assert status == 2 and out == "", err
    assert err.startswith(f"diarist: error: address_in_use: cannot listen on 127.0.0.1:{port}: ") and err.count("\n") == 1
    assert not (tmp_path / "data").exists()


def test_the_listen_check_names_what_is_wrong():
    """One rule for ``serve`` and ``engine`` (cli.listen): a taken port is ``address_in_use``, even when its
    holder set SO_REUSEADDR as uvicorn does; an address this host does not have is ``cannot_listen``; a free
    port passes and is released (it can be bound again at once)."""
    import socket

    from cli.listen import CannotListen, check_listen

    with socket.socket() as rival:
        rival.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rival.bind(("127.0.0.1", 0))
        rival.listen(1)
        port = rival.getsockname()[1]
        with pytest.raises(CannotListen) as e:
            check_listen("127.0.0.1", port)
    assert e.value.code == "address_in_use" and str(e.value).startswith(f"cannot listen on 127.0.0.1:{port}: ")
    with pytest.raises(CannotListen) as e:
        check_listen("192.0.2.1", 0)  # TEST-NET-1: never an address of this host
    assert e.value.code == "cannot_listen" and str(e.value).startswith("cannot listen on 192.0.2.1:0: ")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    check_listen("127.0.0.1", free)
    with socket.create_server(("127.0.0.1", free)):  # the probe did not keep it
        pass


@pytest.mark.parametrize("port", [65536, 70000, -1])
@pytest.mark.parametrize("command", ["engine --model moss-td", "serve", "serve --embedded"])
def test_a_port_out_of_range_is_one_line_before_anything_starts(tmp_path, capsys, monkeypatch, command, port):
    """A port outside 0-65535 is ``cannot_listen`` and exit 2 before anything starts. getaddrinfo takes
    70000 (glibc wraps it to 4464, so a bare probe passed), and uvicorn's bind then raised OverflowError: a
    traceback after the model had loaded (moss-td without a checkpoint would fail while loading, so reaching
    the model is an error here too)."""
    import uvicorn

    from cli.commands import stack

    def started(*_a, **_k):
        raise AssertionError(f"diarist {command} started something on port {port}")

    monkeypatch.setattr(uvicorn, "run", started)
    monkeypatch.setattr(stack.EmbeddedStack, "start", started)
    monkeypatch.setenv("DIARIST_DATA_DIR", str(tmp_path / "data"))
    status, out, err = run_cli(capsys, *command.split(), "--host", "127.0.0.1", "--port", str(port))
    assert status == 2 and out == "", err
    assert err == f"diarist: error: cannot_listen: cannot listen on 127.0.0.1:{port}: a port is 0-65535\n"
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("argv", [["--workers", "0"], ["--embedded", "--workers", "2"]], ids=["zero", "embedded"])
def test_serve_workers_it_cannot_run_is_the_one_error_line(tmp_path, capsys, monkeypatch, argv):
    """``serve --workers`` that cannot run is ``diarist: error: bad_option: ...`` on stderr and exit 2, like
    every other refused option (it was a line on stdout without the code), before anything starts."""
    import uvicorn

    def started(*_a, **_k):
        raise AssertionError("diarist serve started with a --workers it cannot run")

    monkeypatch.setattr(uvicorn, "run", started)
    monkeypatch.setenv("DIARIST_DATA_DIR", str(tmp_path / "data"))
    status, out, err = run_cli(capsys, "serve", *argv)
    assert status == 2 and out == "", out
    assert err == ("diarist: error: bad_option: --workers takes a count >= 1 and runs the API only (not with "
                   "--embedded, whose one process holds the engine)\n")
    assert not (tmp_path / "data").exists()


def test_engine_stops_cleanly_on_sigterm(tmp_path):
    """SIGTERM ends ``diarist engine`` through its cleanup: exit 0 and its scratch directory (spooled
    uploads) removed, not left for the next start to sweep (uvicorn's handler used to re-raise the signal)."""
    import os
    import signal
    import subprocess
    import sys

    from tests.servers import free_port, wait_port

    port = free_port()
    env = {**os.environ, "DIARIST_SCRATCH_DIR": str(tmp_path / "scratch")}
    p = subprocess.Popen([sys.executable, "-m", "cli", "engine", "--port", str(port), "--model", "moss-td",
                          "--load-format", "dummy", "--dummy-config", "tiny"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_port(port, 120)
        assert [d.name for d in (tmp_path / "scratch").iterdir()] == [f"engine-{p.pid}"]
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out[-2000:]
    assert list((tmp_path / "scratch").iterdir()) == []
