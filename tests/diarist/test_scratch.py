"""Per-process scratch directories: a SIGKILLed process's directory is removed by the next start, a live
process's directory is kept (diarist/scratch.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from diarist.scratch import Scratch, pid_alive, sweep

CHILD = """
import sys, time
from pathlib import Path
from diarist.scratch import Scratch
s = Scratch.create(sys.argv[2], Path(sys.argv[1]))
(s.path / "object").write_bytes(b"x" * 4096)  # as a worker's downloaded audio
print(s.path, flush=True)
time.sleep(600)
"""


def _child(parent: Path, role: str) -> tuple[subprocess.Popen, Path]:
    """A process that creates its scratch directory, writes a file there and waits; ``(process, dir)``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(parent), role], stdout=subprocess.PIPE, text=True,
                         env=env)
    line = p.stdout.readline().strip()
    assert line, "the child exited before creating its scratch directory"
    return p, Path(line)


def test_a_killed_process_scratch_is_removed_at_the_next_start_a_live_one_kept(tmp_path):
    parent = tmp_path / "scratch"
    killed, killed_dir = _child(parent, "worker-short")
    live, live_dir = _child(parent, "engine")
    try:
        assert killed_dir == parent / f"worker-short-{killed.pid}"
        killed.send_signal(signal.SIGKILL)  # no finally, no atexit: its file stays behind
        killed.wait(timeout=10)
        assert (killed_dir / "object").stat().st_size == 4096

        mine = Scratch.create("worker-long", parent)  # the next start
        assert mine.removed == [killed_dir]
        assert not killed_dir.exists()
        assert (live_dir / "object").read_bytes() == b"x" * 4096  # its process still runs
        assert mine.path == parent / f"worker-long-{os.getpid()}" and mine.path.is_dir()
        assert mine.path.stat().st_mode & 0o777 == 0o700
        mine.close()
        assert not mine.path.exists()
    finally:
        live.kill()
        live.wait(timeout=10)
        live.stdout.close()
        killed.stdout.close()
    # once the second child is gone too, a sweep removes its directory
    assert sweep(parent) == [live_dir]


def test_only_role_pid_directories_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=10)
    assert not pid_alive(dead.pid) and pid_alive(os.getpid())
    (tmp_path / f"api-{dead.pid}").mkdir()
    (tmp_path / "not-ours").mkdir()  # no pid: someone else's
    (tmp_path / f"file-{dead.pid}").write_text("a file, not a scratch directory")
    assert sweep(tmp_path) == [tmp_path / f"api-{dead.pid}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["not-ours", f"file-{dead.pid}"])


def test_a_stale_directory_with_our_own_pid_is_emptied(tmp_path):
    """A dead process whose pid this process reused left ``<role>-<pid>``: it is not ours, so it is cleared."""
    stale = tmp_path / f"worker-short-{os.getpid()}"
    stale.mkdir()
    (stale / "object").write_bytes(b"old")
    s = Scratch.create("worker-short", tmp_path)
    assert s.path == stale and list(stale.iterdir()) == []


@pytest.mark.parametrize("role", ["", "Worker", "a/b", "-x"])
def test_bad_roles_are_refused(tmp_path, role):
    with pytest.raises(ValueError):
        Scratch.create(role, tmp_path)


def test_a_missing_parent_is_created(tmp_path):
    s = Scratch.create("engine", tmp_path / "a" / "b")
    assert s.path.is_dir() and s.removed == []
