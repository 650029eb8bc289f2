"""``bench_service_gpu.py --engines N`` (issue 22 item 5's measurement, run on a multi-GPU machine): what it
runs, the per-GPU workload, one engine per GPU, and how the engines' engine-only figures combine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_service_gpu as bench
import service_topology as topo


def test_runs_keep_one_engine_as_before_and_add_each_count():
    assert bench.runs("production,embedded", "1") == [("production", 1), ("embedded", 1)]
    assert bench.runs("embedded,production", "2,1") == [("production", 1), ("production", 2), ("embedded", 1)]
    assert bench.runs("production,embedded", "2") == [("production", 2)]  # embedded is one engine
    assert [bench.result_key(t, n) for t, n in bench.runs("production", "1,2")] == ["production", "production-2gpu"]
    with pytest.raises(ValueError):
        bench.runs("production", "0")


def test_the_workload_is_per_gpu_and_each_engine_gets_its_gpu():
    wl = {"jobs": 800, "audio_s": 12.0, "tokens": 60, "concurrency": 64, "full_tokens": 60}
    assert bench.per_gpu(wl, 2) == {**wl, "jobs": 1600, "concurrency": 128}
    assert bench.per_gpu(wl, 1) == wl
    assert topo.engine_devices("cuda", 2) == ["cuda:0", "cuda:1"]
    assert topo.engine_devices("cuda:3", 1) == ["cuda:3"] and topo.engine_devices("cpu", 2) == ["cpu", "cpu"]
    with pytest.raises(ValueError):
        topo.engine_devices("cuda:1", 2)
    # each engine process sees only its GPU (as under docker-compose), of those this one may use
    assert topo.pin_to_gpu("cuda:1", {"PATH": "/bin"}) == ("cuda:0", {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1"})
    assert topo.pin_to_gpu("cuda:1", {"CUDA_VISIBLE_DEVICES": "4,6"})[1]["CUDA_VISIBLE_DEVICES"] == "6"
    assert topo.pin_to_gpu("cpu", {}) == ("cpu", {})


def test_engine_only_figures_add_up_over_engines_run_side_by_side():
    a = {"audio_s_per_s": 2000.0, "wall_s": 4.8, "requests": 800, "truncated": 0,
         "projected_extra_decode_s": 3.0, "full_output_tokens": 10260}
    b = {**a, "audio_s_per_s": 1900.0, "wall_s": 5.0, "projected_extra_decode_s": 3.5}
    assert topo.combine_engine_only([a]) is a
    both = topo.combine_engine_only([a, b])
    assert (both["audio_s_per_s"], both["wall_s"], both["requests"], both["engines"]) == (3900.0, 5.0, 1600, 2)
    assert both["projected_extra_decode_s"] == 3.5 and both["per_engine"] == [a, b]
    one, two = {"service_audio_s_per_s": 100.0}, {"service_audio_s_per_s": 190.0}
    assert bench.scaling(two, one) == {"service_over_one_engine": 1.9}
