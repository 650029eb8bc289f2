"""``benchmarks/bench_service_gpu.py --device cpu --tiny``: the service benchmark's smoke mode, embedded topology
(the production-shaped one starts five processes, ~35 s: run it by hand, benchmarks/README.md), in its own
process (the Celery app and the engine are process-wide there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_tiny_embedded_run_loses_nothing_and_matches_the_engine(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_service_gpu.py"), "--device", "cpu",
                           "--tiny", "--topologies", "embedded", "--workloads", "w-short", "--jobs", "w-short=4",
                           "--commit", "test", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    r = res["workloads"]["w-short"]["embedded"]
    assert (r["jobs"], r["lost"], r["duplicated"], r["submit_errors"]) == (4, 0, 0, [])
    assert r["metrics_match_engine"] == "4/4" and r["engine_sequences"] == 4
    assert r["jobs_with_fixed_output_tokens"] == 4 and r["output_tokens"] == 8  # the benchmark-only switch held
    assert r["engine_only"]["requests"] == 4 and r["engine_only"]["truncated"] == 0
    assert r["engine_audio_s_per_s"] > 0 and r["service_audio_s_per_s"] > 0
    parts = r["per_job_mean_s"]
    assert parts["engine_wall_s"] > 0 and parts["worker_engine_call_s"] >= parts["engine_wall_s"]
    assert 0 < r["worker_engine_share"] <= 1
    assert res["commit"] == "test" and "embedded" in res["topologies"]["embedded"]
