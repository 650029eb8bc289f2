"""Diagnostic for the async-decode hang of issue 8 (GPU). One full-size dummy MOSS-TD engine (bf16, Triton,
decode graphs, encoder stage with graphs on its own stream), then these modes in order:

  race    decode graphs (main stream) replayed while encoder graphs replay on the encoder stream; every
          output is compared bit for bit with a solo replay of the same graph (graph replays are
          deterministic), so a shared cuBLAS workspace shows up as mismatches (or as a hang).
  async   the stall probe of bench_engine (16 decodes + a 90-minute request, 4,096-token chunks).
  legacy  as ``race``, but with extra decode graphs captured on torch.cuda.graph's default capture
          stream, the one the encoder graphs were captured on (what the engine did before the fix).

A watchdog prints every thread's stack and exits if a mode runs longer than ``--limit`` seconds.
Usage: python benchmarks/diag_stall.py [--limit S] [--modes race,async,legacy] [--iters N]
"""

import argparse
import faulthandler
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_engine as be

from engine import Engine, EngineConfig


def _static_decode(eng: Engine, bs: int) -> None:
    """Point the graphs' static inputs at ``bs`` rows with one key each: row i+1, slot i+1, token 1000+i
    (nothing runs yet, so those rows and slots are free; later owners rewrite them)."""
    g, s = eng.runner.graphs, eng.attn._static
    rows = torch.arange(1, bs + 1, device=eng.device)
    eng.table.table[rows, 0] = rows.to(torch.int32)
    g.input_ids[:bs] = 1000 + rows - 1
    g.positions[:bs] = 0
    s["meta"][0, :bs] = rows.to(torch.int32)
    s["meta"][1, :bs] = 1
    s["loc"][:bs] = rows


def _legacy_graphs(eng: Engine, sizes) -> dict:
    """Decode graphs captured on torch.cuda.graph's default capture stream (the pre-fix behaviour)."""
    g, out = eng.runner.graphs, {}
    for bs in sizes:
        eng.attn.prepare_for_capture(bs)
        batch = g._static_batch(bs)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):  # no stream: the default capture stream, shared with the encoder's
            logits = eng.model(batch, eng.attn)
        out[bs] = (graph, logits, None)
    return out


@torch.inference_mode()
def race(eng: Engine, iters: int, decode_graphs: dict) -> dict:
    """Concurrent replays of decode graphs (main stream) and encoder graphs (encoder stream)."""
    eg, es = eng.encoder.graphs, eng.encoder.stream
    if eg is None or es is None or not eg.graphs:
        return {"skipped": "no encoder graphs or no encoder stream"}
    sizes = [b for b in (1, 16, 64) if b in decode_graphs]
    ks = [k for k in (1, 2, 8) if k in eg.graphs]
    eg.input.normal_(0, 0.1)
    torch.cuda.synchronize()
    ref_dec, ref_enc, nondet = {}, {}, 0
    for bs in sizes:
        _static_decode(eng, bs)
        a = []
        for _ in range(2):
            decode_graphs[bs][0].replay()
            a.append(decode_graphs[bs][1][:bs].clone())
        nondet += int(not torch.equal(a[0], a[1]))
        ref_dec[bs] = a[0]
    for k in ks:
        with torch.cuda.stream(es):
            eg.graphs[k][0].replay()
            r1 = eg.graphs[k][1].clone()
            eg.graphs[k][0].replay()
            r2 = eg.graphs[k][1].clone()
        torch.cuda.synchronize()
        nondet += int(not torch.equal(r1, r2))
        ref_enc[k] = r1
    bad_dec = bad_enc = 0
    t0 = time.perf_counter()
    for i in range(iters):
        bs, k = sizes[i % len(sizes)], ks[(i // len(sizes)) % len(ks)]
        _static_decode(eng, bs)
        torch.cuda.synchronize()
        es.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(es):
            eg.graphs[k][0].replay()
            enc_out = eg.graphs[k][1].clone()
        outs = []
        for _ in range(4):  # several decode replays while the encoder graph runs
            decode_graphs[bs][0].replay()
            outs.append(decode_graphs[bs][1][:bs].clone())
        torch.cuda.synchronize()
        bad_dec += sum(not torch.equal(o, ref_dec[bs]) for o in outs)
        bad_enc += int(not torch.equal(enc_out, ref_enc[k]))
    eng.table.table[1:65, 0] = 0
    return {"iterations": iters, "decode_sizes": sizes, "encoder_counts": ks,
            "solo_replays_nondeterministic": nondet, "decode_mismatches": bad_dec,
            "decode_replays": 4 * iters, "encoder_mismatches": bad_enc, "wall_s": time.perf_counter() - t0}


def stall(eng: Engine) -> dict:
    rng = np.random.default_rng(0)
    t = time.time()
    be.run_workload(eng, 4, 12.0, 8, 2, rng)
    out = {"warm_up_s": round(time.time() - t, 1)}
    t = time.time()
    out.update(be.stall_probe(eng, 16, 5400.0, rng))
    out["probe_s"] = round(time.time() - t, 1)
    out["engine_errors"] = eng.counters["errors"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=float, default=45.0, help="watchdog per mode (seconds)")
    ap.add_argument("--modes", default="race,async,legacy")
    ap.add_argument("--iters", type=int, default=150)
    args = ap.parse_args()
    faulthandler.dump_traceback_later(120, exit=True)
    t = time.time()
    eng = Engine(EngineConfig(model="moss-td", load_format="dummy", device="cuda", dtype="bfloat16",
                              attention_backend="triton", max_running_requests=64, async_decode=True,
                              kv_memory_fraction=0.5))
    faulthandler.cancel_dump_traceback_later()
    print("engine start", round(time.time() - t, 1), "s; torch", torch.__version__, torch.cuda.get_device_name(),
          "; streams (decode capture, default capture, encoder):",
          [getattr(x, "cuda_stream", None) for x in (eng.runner.graphs.capture_stream,
                                                    torch.cuda.graph.default_capture_stream, eng.encoder.stream)],
          flush=True)
    graphs = eng.runner.graphs
    for mode in args.modes.split(","):
        faulthandler.dump_traceback_later(args.limit, exit=True)
        t = time.time()
        if mode == "race":
            res = race(eng, args.iters, graphs.graphs)
        elif mode == "legacy":  # kept alive: a destroyed graph drops its capture stream's cuBLAS workspace
            legacy = _legacy_graphs(eng, (1, 16, 64))
            res = race(eng, args.iters, legacy)
        elif mode == "async":
            res = stall(eng)
        else:
            raise SystemExit(f"unknown mode {mode}")
        faulthandler.cancel_dump_traceback_later()
        print(mode, round(time.time() - t, 1), "s", json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
