"""Diagnostic: the stall probe of bench_engine, sync then async, with a watchdog that prints every
thread's stack if a phase hangs. Usage: python benchmarks/diag_stall.py [seconds] [async|sync ...]"""

import faulthandler
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_engine as be

from engine import Engine, EngineConfig

limit = float(sys.argv[1]) if len(sys.argv) > 1 else 90.0
for asy in [a == "async" for a in (sys.argv[2:] or ["async", "sync"])]:
    faulthandler.dump_traceback_later(limit, exit=True)
    eng = Engine(EngineConfig(model="moss-td", load_format="dummy", device="cuda", dtype="bfloat16",
                              attention_backend="triton", max_running_requests=64, async_decode=asy,
                              kv_memory_fraction=0.5))
    rng = np.random.default_rng(0)
    t = time.time()
    be.run_workload(eng, 4, 12.0, 8, 2, rng)
    print("async" if asy else "sync", "warm-up", round(time.time() - t, 1), flush=True)
    for audio_s in (5400.0,):
        t = time.time()
        print("stall", audio_s, be.stall_probe(eng, 16, audio_s, rng), round(time.time() - t, 1), flush=True)
    faulthandler.cancel_dump_traceback_later()
    del eng
