"""docs/architecture.md states the present: every repository path it names exists.

A path is a backquoted token with a ``/`` that ends in ``.py``, ``.md``, ``.sh`` or ``/`` (``engine/kv/``,
``transcription/whisper/pipeline.py``), from the repository root; a sub-folder named alone (``kv/``, in the
sentence about its package) must be a folder of some top-level package.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"`([A-Za-z0-9_./-]+(?:\.py|\.md|\.sh|/))`")


def named_paths(text: str) -> list[str]:
    """The repository paths ``text`` names in backquotes (see the module docstring)."""
    return sorted({m for m in PATH.findall(text) if "/" in m})


def exists(name: str) -> bool:
    """``name`` from the repository root, or a sub-folder (``kv/``) of one of its top-level packages."""
    packages = [d for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith(".")]
    return (ROOT / name).exists() or (name.count("/") == 1 and name.endswith("/")
                                      and any((d / name).is_dir() for d in packages))


def test_named_paths_parse():
    assert named_paths("see `engine/kv/`, `a.py`, `kv/` and `transcription/whisper/pipeline.py`") == [
        "engine/kv/", "kv/", "transcription/whisper/pipeline.py"]
    assert exists("engine/kv/") and exists("kv/") and not exists("engine/nothing.py") and not exists("nokv/")


def test_every_path_the_architecture_doc_names_exists():
    paths = named_paths(DOC.read_text())
    assert len(paths) > 40  # the doc walks one job file by file
    missing = [p for p in paths if not exists(p)]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
