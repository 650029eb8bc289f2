"""Where W-short's time goes (issue 8, GPU): the closed loop of ``bench_engine.run_workload`` with host timers
around the engine's step phases, a census of steps (graph replays vs eager steps with prefill), the GPU
busy time from the torch profiler, and optionally a cProfile of the host.

Host timers wrap: ``Engine._drain`` (includes the encoder stage's launches), ``Scheduler.schedule``,
``ModelRunner.build``, ``ModelRunner.forward`` (graph replay or eager forward), the model's ``prepare``
(admission) and, in async decode, the wait for the step in flight (``event.synchronize``) and the rest of
``OverlapLoop._complete``. A step whose wait is long is GPU-bound; a step whose other phases are long is
host-bound.

Usage: python benchmarks/diag_wshort.py --commit SHA [--concurrency 16] [--requests 200] [--cprofile]
       [--torch-profile] [--out PATH]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_engine as be

from engine import overlap as overlap_mod
from transcription.moss_td_pipeline import build_moss_sequence
from engine.runner import ModelRunner
from engine.scheduler import Scheduler

TIMES: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def _timed(owner, name: str, label: str) -> None:
    fn = getattr(owner, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            TIMES[label] += time.perf_counter() - t
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def instrument(engine) -> None:
    """Wrap the step phases with host timers (class-level for the scheduler/runner, instance for the rest)."""
    _timed(Scheduler, "schedule", "schedule")
    _timed(ModelRunner, "build", "build")
    _timed(ModelRunner, "forward", "forward")
    _timed(engine, "_drain", "drain+encoder_launch")
    _timed(engine.model, "prepare", "model_prepare")
    _timed(overlap_mod.OverlapLoop, "_complete", "complete_total")
    orig_sync = torch.cuda.Event.synchronize

    def sync(self):
        t = time.perf_counter()
        orig_sync(self)
        TIMES["wait_gpu"] += time.perf_counter() - t
        CALLS["wait_gpu"] += 1

    torch.cuda.Event.synchronize = sync


def _clips(requests: int, rng) -> list[np.ndarray]:
    """``requests`` distinct 12 s clips (distinct first sample, so each has its own cache key)."""
    wave = (rng.standard_normal(192_000) * 0.1).astype(np.float32)
    out = []
    for i in range(requests):
        w = wave.copy()
        w[0] = (i + 1) * 1e-6
        out.append(w)
    return out


def census(engine, requests: int, concurrency: int, rng, clips: list[np.ndarray] | None = None) -> dict:
    """``bench_engine.closed_loop`` (clients on their own thread) with a record per
    step: kind (decode graph only, decode + prefill graphs, prefill graph only, eager, nothing to run),
    wall time, running decodes, prefill tokens, requests still in the encoder stage. With ``clips``,
    request i carries ``clips[i]`` as is (a warm encoder cache then skips the encoder)."""
    wave = (rng.standard_normal(192_000) * 0.1).astype(np.float32)

    def make_request(i: int):
        if clips is None:
            return be._request(engine, wave, 60)
        seq = build_moss_sequence(engine, clips[i], max_new_tokens=60)
        seq.ignore_eos, seq.stop_checker = True, None
        return seq

    steps = []
    g, pg = engine.runner.graphs, engine.runner.prefill_graphs

    def recorded_step(_inflight) -> bool:
        r0, q0 = g.replays if g else 0, pg.replays if pg else 0
        p0 = engine.counters["prefill_tokens"]
        running = len(engine.scheduler.running)
        enc = engine.encoder.num_pending
        ts = time.perf_counter()
        ran = engine.step()
        dt = time.perf_counter() - ts
        dg, dp = (g.replays if g else 0) - r0, (pg.replays if pg else 0) - q0
        kind = ("idle" if not ran else "decode_graph" if dg and not dp else "decode+prefill_graphs" if dg
                else "prefill_graph" if dp else "eager")
        steps.append((kind, dt, running, engine.counters["prefill_tokens"] - p0, enc))
        return ran

    torch.cuda.synchronize()
    TIMES.clear()
    CALLS.clear()
    t0 = time.perf_counter()
    done, client_s = be.closed_loop(engine, requests, concurrency, make_request, recorded_step)
    TIMES["client_build_submit (client thread)"] = client_s
    wall = time.perf_counter() - t0
    kinds = {}
    for kind in ("decode_graph", "decode+prefill_graphs", "prefill_graph", "eager", "idle"):
        rows = [r for r in steps if r[0] == kind]
        if rows:
            dts = np.array([r[1] for r in rows])
            kinds[kind] = {"n": len(rows), "total_s": float(dts.sum()), "ms_p50": float(np.median(dts) * 1e3),
                           "ms_mean": float(dts.mean() * 1e3),
                           "running_mean": float(np.mean([r[2] for r in rows])),
                           "prefill_tokens_mean": float(np.mean([r[3] for r in rows])),
                           "in_encoder_mean": float(np.mean([r[4] for r in rows]))}
    lat = np.array([s.timings.finished - s.timings.arrival for s in done])
    return {
        "requests": requests, "concurrency": concurrency, "wall_s": wall,
        "audio_s_per_s": requests * 12.0 / wall, "steps": len(steps), "step_kinds": kinds,
        "latency_mean_s": float(lat.mean()),
        "queue_to_admit_mean_s": float(np.mean([s.timings.admitted - s.timings.arrival for s in done])),
        "host_phases_s": {k: round(v, 4) for k, v in sorted(TIMES.items(), key=lambda kv: -kv[1])},
        "host_phase_calls": dict(CALLS),
        "encoder": {k: v for k, v in engine.encoder.stats().items() if isinstance(v, (int, float))},
    }


def gpu_busy(engine, requests: int, concurrency: int, rng) -> dict:
    """Kernel time per stream over a run, from the torch profiler (busy = sum of kernel durations)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        t0 = time.perf_counter()
        census(engine, requests, concurrency, rng)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    per_stream: dict[str, float] = defaultdict(float)
    top: dict[str, float] = defaultdict(float)
    for ev in p.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per_stream[str(getattr(ev, "device_resource_id", "?"))] += ev.device_time / 1e6
            top[ev.name[:70]] += ev.device_time / 1e6
    return {"wall_s": wall, "kernel_s_per_stream": dict(per_stream),
            "top_kernels_s": dict(sorted(top.items(), key=lambda kv: -kv[1])[:25])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--commit", default="")
    ap.add_argument("--concurrency", default="16")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--torch-profile", action="store_true")
    ap.add_argument("--warm", action="store_true", help="also a run whose clips are all in the encoder cache")
    ap.add_argument("--no-prefill-graphs", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    eargs = argparse.Namespace(backend="triton", graph_max_bs=64, chunk_size=4096, async_decode=None,
                               kv_fraction=0.5, no_prefill_graphs=args.no_prefill_graphs)
    engine = be.make_engine(eargs)
    rng = np.random.default_rng(0)
    be.run_workload(engine, 8, 12.0, 8, 4, rng)
    instrument(engine)
    res: dict = {"command": " ".join(sys.argv), "commit": args.commit, "torch": torch.__version__,
                 "runs": {}}
    for c in [int(x) for x in args.concurrency.split(",")]:
        census(engine, 2 * c, c, rng)  # warm-up at this concurrency
        r = census(engine, args.requests, c, rng)
        if args.cprofile:
            prof = cProfile.Profile()
            prof.enable()
            census(engine, min(args.requests, 100), c, rng)
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
            r["cprofile_top_tottime"] = s.getvalue().splitlines()[:60]
        if args.torch_profile:
            r["gpu"] = gpu_busy(engine, min(args.requests, 100), c, rng)
        if args.warm:
            clips = _clips(args.requests, rng)
            engine.encoder.cache.resize(max_entries=args.requests + 64)
            census(engine, args.requests, c, rng, clips)  # fills the cache
            r["warm"] = census(engine, args.requests, c, rng, clips)
            engine.encoder.cache.clear()
            engine.encoder.cache.resize(max_entries=engine.config.encoder_cache_entries)
        res["runs"][str(c)] = r
        print(json.dumps({k: v for k, v in r.items() if k != "cprofile_top_tottime"}, indent=1), flush=True)
        if args.cprofile:
            print("\n".join(r["cprofile_top_tottime"]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
