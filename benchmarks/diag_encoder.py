"""Encoder diagnostics on one GPU (issue 9): where the fc1 + GELU time goes, and where W-90's encoder phase
goes beyond the encoder's own kernels.

Sections (one JSON object, written to ``--out`` after each):
  gemm_gelu  Whisper-medium's fc1 + GELU at 1 and 8 windows (M = 1500, 12000; K = 1024, N = 4096), each
             variant timed with CUDA events (mean of 50 calls after warm-up) and its error against float32
             (inputs upcast, exact GELU): cuBLAS + separate erf GELU (the unfused path), cuBLAS alone (the
             floor) and cuBLASLt's fused GELU epilogue (``torch._addmm_activation``; tanh approximation).
             At 75acd17 this also timed a Triton GEMM with an erf epilogue: 451 TFLOPS at M = 12000 vs
             cuBLAS's 708, slower than GEMM + GELU, so it was dropped (results/archive/diag_encoder_h200_75acd17.json).
  encoder    the MOSS-TD encoder (dummy weights) at 1 and 8 windows, eager and graphs, with the fused
             fc1 + GELU (``EngineConfig.fused_gelu_gemm``) and without, and the largest output difference between the two.
  w90        one 90-minute recording (180 windows) through the engine's encoder stage, under the torch
             profiler: wall phases, the encoder stream's kernel time and span, the host calls that took
             longest, and the same phase without the encoder cache (no host copy of the embeddings).

Run on the GPU machine:
  python benchmarks/diag_encoder.py --commit <sha> --out $OUT/diag_encoder.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_engine
from benchmarks.bench_encoder import request
from engine import Engine, EngineConfig
from engine.encoder_cache import EncoderCache
from engine.encoder_graphs import EncoderGraphs
from engine.loaders.registry import load_model
from engine.ops import linear as engine_linear

SR = 16_000


def _kernel_names(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key[:100] for e in prof.key_averages() if e.device_type.name == "CUDA"})


@torch.inference_mode()
def gemm_gelu() -> dict:
    dev, k, n = torch.device("cuda"), 1024, 4096
    g = torch.Generator(device=dev).manual_seed(0)
    w = (torch.randn(n, k, device=dev, generator=g) * 1.5 / k**0.5).to(torch.bfloat16)
    b = (torch.randn(n, device=dev, generator=g) * 0.5).to(torch.bfloat16)
    out: dict = {"k": k, "n": n, "by_m": {}}
    for m in (1500, 12000):
        x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
        exact = F.gelu(x.float() @ w.float().T + b.float())
        variants = {
            "cublas_then_gelu_erf": lambda x=x: F.gelu(F.linear(x, w, b)),
            "cublas_only": lambda x=x: F.linear(x, w, b),
            "cublaslt_gelu_tanh_epilogue": lambda x=x: torch._addmm_activation(b, x, w.t(), use_gelu=True),
        }
        rows = {}
        for name, fn in variants.items():
            try:
                y = fn()
                ms = bench_engine.cuda_ms(fn)
                row = {"ms": ms, "tflops": 2 * m * k * n / ms / 1e9}
                if name != "cublas_only":
                    err = (y.float() - exact).abs()
                    row.update(max_abs_err=err.max().item(), mean_abs_err=err.mean().item())
            except Exception as e:  # noqa: BLE001 -- a variant that fails is reported, not fatal
                row = {"error": f"{type(e).__name__}: {e}"[:300]}
            rows[name] = row
            print("gemm_gelu", m, name, json.dumps(row), flush=True)
        rows["cublaslt_kernels"] = _kernel_names(variants["cublaslt_gelu_tanh_epilogue"])
        out["by_m"][m] = rows
    return out


@torch.inference_mode()
def encoder(model) -> dict:
    dev, enc = torch.device("cuda"), model.audio_encoder
    waves = torch.randn(8, 480_000, device=dev) * 0.1
    res: dict = {}
    outs = {}
    for fused in (False, True):
        engine_linear.set_linear_kernels(enc, engine_linear.LinearKernels(fused_gelu_gemm=fused))
        graphs = EncoderGraphs(model.window_mel, enc, dev, [1, 8])
        graphs.capture(torch.cuda.Stream())
        tag = "fused" if fused else "unfused"
        for w in (1, 8):
            x = waves[:w]
            mel = model.window_mel(x)
            res[f"{tag}_eager_{w}_ms"] = bench_engine.cuda_ms(lambda mel=mel: enc(mel), 20)
            res[f"{tag}_graph_{w}_ms"] = bench_engine.cuda_ms(lambda x=x, graphs=graphs: graphs(x), 20)
        outs[tag] = enc(model.window_mel(waves)).float()
        res[f"{tag}_graph_equals_eager_8"] = bool(torch.equal(graphs(waves).float(), outs[tag]))
        del graphs
        print("encoder", json.dumps(res), flush=True)
    d = (outs["fused"] - outs["unfused"]).abs()
    res.update(fused_vs_unfused_max_abs=d.max().item(), fused_vs_unfused_mean_abs=d.mean().item(),
               output_max_abs=outs["unfused"].abs().max().item())
    engine_linear.set_linear_kernels(enc, engine_linear.LinearKernels(fused_gelu_gemm=True))
    torch.cuda.empty_cache()
    return res


def _w90_once(engine, wave: np.ndarray, profile: bool) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    seq = request(engine, wave, 1)
    torch.cuda.synchronize()
    prof = tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) if profile else None
    if prof is not None:
        prof.__enter__()
    ts = time.perf_counter()
    engine.submit(seq)
    t_sub = time.perf_counter()
    steps = 0
    while seq.row is None and not seq.finished:
        engine.step()
        steps += 1
    t_end = time.perf_counter()
    torch.cuda.synchronize()
    if prof is not None:
        prof.__exit__(None, None, None)
    out = {"submit_s": t_sub - ts, "submit_to_admitted_s": t_end - t_sub,
           "encoder_phase_s": seq.timings.encoder_s, "steps": steps, "error": seq.error}
    engine.abort(seq)
    while engine.scheduler.has_work() or engine.encoder.has_work():
        engine.step()
    if prof is None:
        return out
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    if kernels:
        t0 = min(e.time_range.start for e in kernels)
        out["gpu_span_s"] = (max(e.time_range.end for e in kernels) - t0) / 1e6
        out["gpu_kernel_sum_s"] = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
    avg = prof.key_averages()
    out["top_host"] = [{"name": e.key[:80], "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3}
                       for e in sorted(avg, key=lambda e: -e.self_cpu_time_total)[:15]]
    out["top_gpu"] = [{"name": e.key[:80], "calls": e.count, "ms": e.self_device_time_total / 1e3}
                      for e in sorted(avg, key=lambda e: -e.self_device_time_total)[:12]]
    return out


def w90(engine) -> dict:
    wave = (np.random.default_rng(1).standard_normal(5400 * SR) * 0.1).astype(np.float32)
    res = {"plain_1": _w90_once(engine, wave, False)}
    wave[0] += 1e-3
    res["plain_2"] = _w90_once(engine, wave, False)
    wave[0] += 1e-3
    res["profiled"] = _w90_once(engine, wave, True)
    cache = engine.encoder.cache
    engine.encoder.cache = EncoderCache(0, 0)
    wave[0] += 1e-3
    res["no_cache"] = _w90_once(engine, wave, False)
    engine.encoder.cache = cache
    print("w90", json.dumps({k: {kk: v for kk, v in r.items() if not kk.startswith("top")}
                             for k, r in res.items()}), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", default="")
    ap.add_argument("--sections", default="gemm_gelu,encoder,w90")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    res = bench_engine.result_header(args.commit)
    save = bench_engine.json_saver(res, args.out)

    sections = args.sections.split(",")
    if "gemm_gelu" in sections:
        res["gemm_gelu"] = gemm_gelu()
        save()
    if "encoder" in sections or "w90" in sections:
        cfg = EngineConfig(model="moss-td", load_format="dummy", device="cuda", dtype="bfloat16",
                           attention_backend="triton", max_running_requests=64, kv_memory_fraction=0.6,
                           seed=0)
        loaded = load_model(cfg)
        if "encoder" in sections:
            res["encoder"] = encoder(loaded.model)
            save()
        if "w90" in sections:
            res["w90"] = w90(Engine(cfg, loaded=loaded))
            save()
    print(json.dumps(res, indent=1)[:20000])


if __name__ == "__main__":
    main()
