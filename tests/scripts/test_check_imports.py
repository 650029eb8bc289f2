"""The import-graph check (scripts/check_imports.py): the tree has no circles and no upward arrows, and the
check finds both kinds when they are there."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import check_imports as check

ROOT = Path(__file__).resolve().parents[2]


def test_tree_has_no_circles_and_no_upward_arrows():
    problems, text = check.report(ROOT)
    assert problems == 0, text
    assert ", 0 circles, 0 upward arrows" in text


def _check(root: Path, files: dict[str, str]) -> tuple[int, str]:
    """Write ``files`` (relative path -> source) under ``root`` and run the check there."""
    for rel, body in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return check.report(root)


CIRCLES = {
    "function-level import": (
        {"engine/__init__.py": "", "engine/a.py": "from engine.b import g\n",
         "engine/b.py": "def g():\n    from engine import a\n    return a\n"},
        ["circle: engine.a <-> engine.b", "engine/b.py:2: engine.b -> engine.a"]),
    # importing pkg.sub runs pkg/__init__, which imports the importer back (the old api.admin <-> api.metrics)
    "through a package init": (
        {"api/__init__.py": "", "api/metrics.py": "def f():\n    from api.admin.engines import x\n",
         "api/admin/__init__.py": "from api import metrics\n", "api/admin/engines.py": "x = 1\n"},
        ["circle: api.admin <-> api.metrics", "api/metrics.py:2: api.metrics -> api.admin"]),
}


@pytest.mark.parametrize("case", sorted(CIRCLES))
def test_circles_are_found(tmp_path, case):
    files, expected = CIRCLES[case]
    problems, text = _check(tmp_path, files)
    assert problems == 1, text
    for line in expected:
        assert line in text


def test_a_package_without_a_layer_is_reported(tmp_path):
    problems, text = _check(tmp_path, {"engine/__init__.py": "", "newpkg/__init__.py": "import engine\n"})
    assert problems == 1
    assert "unlayered: newpkg/ is a package with no layer in LAYERS" in text


def test_package_init_importing_its_submodules_is_no_circle(tmp_path):
    problems, text = _check(tmp_path, {
        "engine/__init__.py": "",
        "engine/ops/__init__.py": "from engine.ops.norm import rms\n",
        "engine/ops/_kernels.py": "k = 1\n",
        "engine/ops/norm.py": "from engine.ops._kernels import k\nrms = k\n",
    })
    assert problems == 0, text


@pytest.mark.parametrize(("src", "stmt", "dst_pkg"), [
    ("engine/x.py", "from transcription import t\n", "transcription"),
    ("diarist/x.py", "import worker.tasks\n", "worker"),
    ("diarist/x.py", "from engine.engine import E\n", "engine"),  # only engine.config is allowed
    ("worker/x.py", "from api import app\n", "api"),
    ("api/x.py", "import worker.tasks\n", "worker"),
    ("api/x.py", "from cli import main\n", "cli"),
    ("engine/x.py", "from tests import helpers\n", "tests"),
])
def test_upward_arrow_is_found(tmp_path, src, stmt, dst_pkg):
    problems, text = _check(tmp_path, {
        "engine/__init__.py": "", "engine/config.py": "", "engine/engine.py": "E = 1\n",
        "transcription/__init__.py": "", "transcription/t.py": "",
        "worker/__init__.py": "", "worker/tasks.py": "", "api/__init__.py": "", "api/app.py": "",
        "cli/__init__.py": "main = 1\n", "tests/__init__.py": "", "tests/helpers.py": "",
        "diarist/__init__.py": "", src: stmt,
    })
    assert problems == 1, text
    assert f"may not import {dst_pkg})" in text


def test_allowed_arrows_pass(tmp_path):
    problems, text = _check(tmp_path, {
        "engine/__init__.py": "from engine.config import C\n", "engine/config.py": "C = 1\n",
        "diarist/__init__.py": "", "diarist/settings.py": "def f():\n    from engine.config import C\n",
        "transcription/__init__.py": "import engine\nimport diarist.settings\n",
        "worker/__init__.py": "from transcription import x\n",
        "api/__init__.py": "import transcription\n",
        "cli/__init__.py": "import api, worker, transcription, engine, diarist\n",
    })
    assert problems == 0, text
