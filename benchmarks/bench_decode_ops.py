"""Decode-step operators on the GPU: our Triton GEMV vs cuBLAS at MOSS-TD's decoder shapes, and the fused
elementwise kernels vs their unfused torch chains. Each variant is captured in a CUDA graph of 20 calls
over rotating weight copies (more bytes than the L2 cache holds) and timed by replaying it.

Usage: python benchmarks/bench_decode_ops.py [--out results.json] [--commit SHA]
Prints a table; the JSON has microseconds per call and the HBM bandwidth each GEMV reached.
"""

# ruff: noqa: B023
# (each lambda runs inside graph_us before its loop variables change)
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.ops import triton_kernels as tk
from engine.ops import triton_rope
from engine.ops.activation import silu_and_mul_reference
from engine.ops.norm import rms_norm_reference
from engine.ops.rotary import RotaryTable, qk_norm_rope_reference

# (name, N, K) of Qwen3-0.6B's decoder matrices with q/k/v and gate/up fused
SHAPES = [("qkv", 4096, 1024), ("o_proj", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072),
          ("lm_head", 151_936, 1024)]
CALLS = 20


def graph_us(fn, calls: int = CALLS) -> float:
    """Median microseconds per call of ``fn(i)`` (i = 0..calls-1), captured as one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def bench_gemv(rows: list[int]) -> list[dict]:
    out = []
    for name, n, k in SHAPES:
        copies = max(2, min(CALLS, (400 << 20) // (n * k * 2)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x, ws[0]).float()
            err = float((tk.gemv(x, ws[0]).float() - ref).norm() / ref.norm()) if tk.gemv_supported(m, k) else None
            cublas = graph_us(lambda i, x=x: torch.nn.functional.linear(x, ws[i % copies]))
            ours = graph_us(lambda i, x=x: tk.gemv(x, ws[i % copies])) if tk.gemv_supported(m, k) else None
            nbytes = n * k * 2
            out.append({"matrix": name, "N": n, "K": k, "M": m, "cublas_us": cublas, "triton_us": ours,
                        "cublas_tb_s": nbytes / cublas / 1e6, "triton_tb_s": nbytes / ours / 1e6 if ours else None,
                        "rel_err_vs_cublas": err})
    return out


def sweep_gemv() -> list[dict]:
    """Triton GEMV tiles at M = 1: rows per program x warps, per matrix shape."""
    out = []
    for name, n, k in SHAPES:
        copies = max(2, min(CALLS, (400 << 20) // (n * k * 2)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        for bn in (1, 2, 4, 8, 16):
            for warps in (1, 2, 4, 8):
                if bn * k > 32_768:
                    continue
                us = graph_us(lambda i, x=x, bn=bn, warps=warps: tk.gemv(x, ws[i % copies], bn, warps))
                out.append({"matrix": name, "N": n, "K": k, "block_n": bn, "warps": warps, "us": us,
                            "tb_s": n * k * 2 / us / 1e6, "default": (bn, warps) == tk.gemv_tile(k)})
    return out


def bench_elementwise(rows: list[int]) -> list[dict]:
    out = []
    dt, dev = torch.bfloat16, "cuda"
    rope = RotaryTable(128, 1e6, 131_072)
    cos, sin = rope.get(torch.device(dev), dt)
    for m in rows:
        x, r = torch.randn(m, 1024, device=dev, dtype=dt), torch.randn(m, 1024, device=dev, dtype=dt)
        w = torch.randn(1024, device=dev, dtype=dt)
        qkv = torch.randn(m, 4096, device=dev, dtype=dt)
        qw, kw = torch.randn(128, device=dev, dtype=dt), torch.randn(128, device=dev, dtype=dt)
        pos = torch.randint(0, 35_000, (m,), device=dev)
        gu = torch.randn(m, 6144, device=dev, dtype=dt)
        cases = {
            "add_rms_norm": (lambda i: tk.add_rms_norm(x, r, w, 1e-6),
                             lambda i: rms_norm_reference(r + x, w, 1e-6)),
            "qk_norm_rope": (lambda i: triton_rope.qk_norm_rope(qkv, pos, cos, sin, qw, kw, 16, 8, 1e-6),
                             lambda i: qk_norm_rope_reference(qkv, pos, 1e6, qw, kw, 16, 8, 1e-6)),
            "silu_and_mul": (lambda i: tk.silu_and_mul(gu), lambda i: silu_and_mul_reference(gu)),
        }
        for name, (fused, unfused) in cases.items():
            out.append({"op": name, "M": m, "fused_us": graph_us(fused), "unfused_torch_us": graph_us(unfused)})
    return out


def bench_decode_attention() -> list[dict]:
    """Stage 1 + 2 of split-KV decode (bf16, 16 q / 8 kv heads of 128) at three batch/context points,
    over launch variants: splits per row, keys per tile, warps, pipeline stages."""
    from engine.attention.triton_ops import decode_attention

    out = []
    for bs, ctx, fills in [(1, 35_000, (32, 64, 128)), (16, 33_000, (3, 8, 16, 32)), (64, 600, (1, 3))]:
        hq, hkv, d = 16, 8, 128
        slots = bs * ctx + 1
        k = torch.randn(slots, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(slots, hkv, d, device="cuda", dtype=torch.bfloat16)
        table = (torch.arange(bs * ctx, device="cuda", dtype=torch.int32) + 1).view(bs, ctx)
        rows = torch.arange(bs, device="cuda", dtype=torch.int32)
        lens = torch.full((bs,), ctx, device="cuda", dtype=torch.int32)
        q = torch.randn(bs, hq, d, device="cuda", dtype=torch.bfloat16)
        o = torch.empty_like(q)
        nbytes = 2 * bs * ctx * hkv * d * 2
        ref = None
        for fill in fills:
            for block_n in (64, 128):
                for warps in (4, 8):
                    for stages in (2, 3):
                        po = torch.empty(bs, hq, 128, d, device="cuda", dtype=torch.float32)
                        pl = torch.empty(bs, hq, 128, device="cuda", dtype=torch.float32)

                        def fn(i, fill=fill, block_n=block_n, warps=warps, stages=stages, po=po, pl=pl):
                            decode_attention(q, k, v, rows, lens, o, sm_scale=d ** -0.5, table=table,
                                             fill_splits=fill, max_splits=128, part_o=po, part_lse=pl,
                                             block_n=block_n, num_warps=warps, num_stages=stages)
                        try:
                            us = graph_us(fn, calls=5)
                        except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
                            out.append({"batch": bs, "context": ctx, "fill": fill, "block_n": block_n,
                                        "warps": warps, "stages": stages, "error": str(e)[:200]})
                            continue
                        if ref is None:
                            ref = o.clone()
                        err = float((o.float() - ref.float()).norm() / ref.float().norm())
                        out.append({"batch": bs, "context": ctx, "fill": fill, "block_n": block_n, "warps": warps,
                                    "stages": stages, "us": us, "tb_s": nbytes / us / 1e6, "rel_diff": err})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="")
    ap.add_argument("--commit", default="")
    ap.add_argument("--only", default="", help="comma list of sections: gemv,sweep,elementwise,attention")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else {"gemv", "sweep", "elementwise", "attention"}
    res = {"command": " ".join(sys.argv), "commit": args.commit, "device": torch.cuda.get_device_name(),
           "torch": torch.__version__,
           "gemv": bench_gemv([1, 2, 4, 8, 16]) if "gemv" in only else [],
           "gemv_sweep_m1": sweep_gemv() if "sweep" in only else [],
           "elementwise": bench_elementwise([1, 16, 64]) if "elementwise" in only else [],
           "decode_attention": bench_decode_attention() if "attention" in only else []}
    for name, _, _ in SHAPES:
        rows = sorted((r for r in res["gemv_sweep_m1"] if r["matrix"] == name), key=lambda r: r["us"])
        if rows:
            best, dflt = rows[0], next(r for r in rows if r["default"])
            print(f"sweep {name:8s} best bn={best['block_n']} w={best['warps']} {best['us']:.1f} us "
                  f"({best['tb_s']:.2f} TB/s); default bn={dflt['block_n']} w={dflt['warps']} {dflt['us']:.1f} us")
    for g in res["gemv"]:
        t = f"{g['triton_us']:8.1f} ({g['triton_tb_s']:.2f} TB/s)" if g["triton_us"] else "       -"
        print(f"{g['matrix']:8s} M={g['M']:2d}  cuBLAS {g['cublas_us']:8.1f} us ({g['cublas_tb_s']:.2f} TB/s)  "
              f"triton {t}")
    for e in res["elementwise"]:
        print(f"{e['op']:13s} M={e['M']:2d}  fused {e['fused_us']:6.1f} us  torch {e['unfused_torch_us']:6.1f} us")
    for a in res["decode_attention"]:
        if "us" in a:
            print(f"attn bs={a['batch']:2d} ctx={a['context']:5d} fill={a['fill']:3d} bn={a['block_n']:3d} "
                  f"w={a['warps']} st={a['stages']}  {a['us']:7.1f} us  {a['tb_s']:.2f} TB/s  diff {a['rel_diff']:.1e}")
        else:
            print("attn", a)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
