"""Is cuBLAS leaving bandwidth on the table for decode-step GEMMs at 16-64 rows? A diagnostic, not an engine
kernel: a plain Triton tile GEMM (``tl.dot``, one 64-row tile covering every row, optional split-K with
float32 atomics) swept over tiles at Qwen3-0.6B's decoder matrices, against ``F.linear``; then the whole
28-layer chain of weight GEMMs of one decode step (qkv, o_proj, gate_up, down per layer, 840 MB, no L2
reuse) captured as one CUDA graph, cuBLAS vs the best tile per matrix, and the single-pass tiles with and
without programmatic dependent launch (each GEMM lets the next one launch at its start and waits for the
previous one before loading, Hopper's griddepcontrol).

Usage (GPU): python benchmarks/diag_small_m_gemm.py --commit SHA --out OUT.json
"""

# ruff: noqa: B023
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_decode_ops import graph_us
from benchmarks.bench_engine import json_saver, result_header

SHAPES = [("qkv", 4096, 1024), ("o_proj", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072)]
LAYERS = 28


@triton.jit
def _tile_gemm(X, W, Y, M, N, sxm, swn, sym, K_PER: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # programmatic dependent launch: let the next kernel start launching now; wait for the last one
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * K_PER
    rm = tl.arange(0, BM)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kk in tl.range(0, K_PER, BK, num_stages=STAGES):
        rk = k0 + kk + tl.arange(0, BK)
        x = tl.load(X + rm[:, None] * sxm + rk[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(W + rn[:, None].to(tl.int64) * swn + rk[None, :], mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    out = Y + rm[:, None] * sym + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT == 1:
        tl.store(out, acc.to(Y.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(out, acc, mask=mask, sem="relaxed")


def tile_gemm(x: torch.Tensor, w: torch.Tensor, bn: int, bk: int, split: int, stages: int, warps: int,
              scratch: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """``x @ w.T``: x ``[M <= 64, K]``, w ``[N, K]`` bf16 -> ``[M, N]`` bf16. Split-K accumulates into the
    float32 ``scratch`` ``[M, N]`` (zeroed here) and casts at the end, both counted in the time."""
    m, k = x.shape
    n = w.shape[0]
    grid = (triton.cdiv(n, bn), split)
    if split == 1:
        y = torch.empty(m, n, device=x.device, dtype=x.dtype)
        _tile_gemm[grid](x, w, y, m, n, x.stride(0), w.stride(0), y.stride(0), K_PER=k, BM=64, BN=bn, BK=bk,
                         SPLIT=1, STAGES=stages, PDL=pdl, num_warps=warps, launch_pdl=pdl)
        return y
    scratch.zero_()
    _tile_gemm[grid](x, w, scratch, m, n, x.stride(0), w.stride(0), scratch.stride(0), K_PER=k // split, BM=64,
                     BN=bn, BK=bk, SPLIT=split, STAGES=stages, PDL=pdl, num_warps=warps, launch_pdl=pdl)
    return scratch.to(x.dtype)


def sweep(rows: list[int]) -> dict:
    out = {}
    for name, n, k in SHAPES:
        copies = max(2, min(20, (400 << 20) // (n * k * 2)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            scratch = torch.empty(m, n, device="cuda", dtype=torch.float32)
            ref = F.linear(x, ws[0]).float()
            cublas = graph_us(lambda i: F.linear(x, ws[i % copies]))
            rows_out = []
            for bn, bk, split, stages, warps in itertools.product((16, 32, 64), (64, 128, 256), (1, 2, 4), (3, 5),
                                                                 (4,)):
                if k % (split * bk):
                    continue
                cfg = {"bn": bn, "bk": bk, "split": split, "stages": stages, "warps": warps}
                try:
                    err = float((tile_gemm(x, ws[0], scratch=scratch, **cfg).float() - ref).norm() / ref.norm())
                    us = graph_us(lambda i: tile_gemm(x, ws[i % copies], scratch=scratch, **cfg))
                except OutOfResources as e:  # a tile that does not fit the shared memory: skip it, say why
                    rows_out.append({**cfg, "error": f"{type(e).__name__}: {str(e)[:120]}"})
                    continue
                rows_out.append({**cfg, "us": us, "rel_err": err})
            ok = [r for r in rows_out if "us" in r]
            best = min(ok, key=lambda r: r["us"])
            key = f"{name}_m{m}"
            out[key] = {"N": n, "K": k, "M": m, "cublas_us": cublas, "cublas_tb_s": n * k * 2 / cublas / 1e6,
                        "best": best, "best_tb_s": n * k * 2 / best["us"] / 1e6, "configs": rows_out}
            print(f"{key:14s} cuBLAS {cublas:6.2f} us ({n * k * 2 / cublas / 1e6:.2f} TB/s)  best tile "
                  f"{best['us']:6.2f} us ({n * k * 2 / best['us'] / 1e6:.2f} TB/s) {best}", flush=True)
    return out


def chain(rows: list[int], best: dict) -> dict:
    """One decode step's 112 weight GEMMs (28 layers, distinct weights) as one graph: cuBLAS vs best tiles."""
    weights = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _, n, k in SHAPES]
               for _ in range(LAYERS)]
    out = {}
    for m in rows:
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, _, k in SHAPES]
        scratches = [torch.empty(m, n, device="cuda", dtype=torch.float32) for _, n, _ in SHAPES]
        cfgs = [{c: best[f"{name}_m{m}"]["best"][c] for c in ("bn", "bk", "split", "stages", "warps")}
                for name, _, _ in SHAPES]

        def step_cublas(_i):
            for layer in weights:
                for x, w in zip(xs, layer, strict=True):
                    F.linear(x, w)

        def step_tiles(_i):
            for layer in weights:
                for x, w, s, cfg in zip(xs, layer, scratches, cfgs, strict=True):
                    tile_gemm(x, w, scratch=s, **cfg)

        def step_tiles_pdl(_i):  # split-K's memset and cast are not PDL launches: single-pass tiles only
            for layer in weights:
                for x, w, cfg in zip(xs, layer, cfgs, strict=True):
                    tile_gemm(x, w, **{**cfg, "split": 1}, pdl=True)

        def step_tiles_nopdl(_i):
            for layer in weights:
                for x, w, cfg in zip(xs, layer, cfgs, strict=True):
                    tile_gemm(x, w, **{**cfg, "split": 1})

        a, b = graph_us(step_cublas, calls=1), graph_us(step_tiles, calls=1)
        c, d = graph_us(step_tiles_nopdl, calls=1), graph_us(step_tiles_pdl, calls=1)
        nbytes = sum(n * k * 2 for _, n, k in SHAPES) * LAYERS
        out[f"m{m}"] = {"cublas_ms": a / 1e3, "tiles_ms": b / 1e3, "hbm_limit_ms": nbytes / 4.8e12 * 1e3,
                        "cublas_tb_s": nbytes / a / 1e6, "tiles_tb_s": nbytes / b / 1e6, "tile_configs": cfgs,
                        "tiles_no_split_ms": c / 1e3, "tiles_no_split_pdl_ms": d / 1e3}
        print(f"chain M={m}: cuBLAS {a / 1e3:.3f} ms, tiles {b / 1e3:.3f} ms "
              f"(HBM limit {nbytes / 4.8e12 * 1e3:.3f} ms); "
              f"no split-K {c / 1e3:.3f} ms, with PDL {d / 1e3:.3f} ms", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--rows", default="16,32,56")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    res = result_header(args.commit)
    res["sweep"] = sweep(rows)
    res["chain"] = chain(rows, res["sweep"])
    json_saver(res, args.out)()


if __name__ == "__main__":
    main()
