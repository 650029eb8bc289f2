"""Per-process scratch directories under one known parent, swept of dead processes' leftovers at start.

A process that is SIGKILLed (or OOM-killed) never runs its ``finally`` blocks, so a temporary file it
held (a worker's downloaded audio, an engine server's spooled upload) would stay in ``/tmp`` forever.
Instead each long-lived process (``diarist worker``, ``diarist engine``) writes its temporary files
under ``<parent>/<role>-<pid>``, and at start it removes every ``<role>-<pid>`` directory of the parent
whose process no longer runs: a crash leaves at most one process's files, until the next start.

The parent defaults to ``<tempfile.gettempdir()>/diarist`` (``DIARIST_SCRATCH_DIR`` overrides it). It must
be local to one host and one PID namespace (not a volume shared between hosts or containers): liveness
is judged by PID.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

_NAME = re.compile(r"^(?P<role>[a-z0-9][a-z0-9_-]*)-(?P<pid>[0-9]+)$")
"""``<role>-<pid>``; anything else in the parent is not ours to remove."""


def default_parent() -> Path:
    """``<tempfile.gettempdir()>/diarist`` (honours ``TMPDIR``)."""
    return Path(tempfile.gettempdir()) / "diarist"


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` runs on this host (signal 0: nothing is sent). A process of
    another user counts as alive (``PermissionError``): its directory is not ours to judge."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(parent: Path) -> list[Path]:
    """Remove the ``<role>-<pid>`` directories of ``parent`` whose process no longer runs. Returns the
    removed paths. Other entries, and directories of live processes, are kept; removal errors (another
    user's files, a concurrent sweep) are ignored, the next start tries again."""
    removed = []
    try:
        entries = list(parent.iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        m = _NAME.match(entry.name)
        if m is None or not entry.is_dir() or entry.is_symlink() or pid_alive(int(m["pid"])):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    return removed


@dataclass(frozen=True)
class Scratch:
    """This process's scratch directory (``path``) and the dead processes' directories its start removed.

    Create one per process with :meth:`create` (the CLI commands do) and pass ``path`` to what writes
    temporary files (``S3Store(scratch_dir=...)``, ``create_engine_app(spool_dir=...)``); :meth:`close`
    at a clean exit removes it.
    """

    path: Path
    removed: list[Path] = field(default_factory=list)

    @classmethod
    def create(cls, role: str, parent: Path | None = None) -> Scratch:
        """Sweep ``parent`` (default :func:`default_parent`) and make ``<parent>/<role>-<pid>`` (mode 0700).

        Raises ValueError for a ``role`` that is not lower-case letters, digits, ``-`` and ``_``; OSError
        when the parent cannot be created."""
        pid = os.getpid()
        if _NAME.match(f"{role}-{pid}") is None:
            raise ValueError(f"scratch role {role!r}: use lower-case letters, digits, '-' and '_'")
        parent = Path(parent) if parent is not None else default_parent()
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        removed = sweep(parent)
        own = parent / f"{role}-{pid}"
        # A directory with our own pid is a dead process's whose pid was reused (we just started).
        shutil.rmtree(own, ignore_errors=True)
        own.mkdir(mode=0o700)
        return cls(own, removed)

    def close(self) -> None:
        """Remove this process's directory and everything in it."""
        shutil.rmtree(self.path, ignore_errors=True)
