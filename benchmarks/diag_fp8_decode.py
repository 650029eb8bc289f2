"""Decode attention alone, bf16 KV vs FP8 KV, over launch shapes: where an FP8 decode step's time goes.

One layer of MOSS-TD's decoder attention (16 query heads, 8 KV heads, head_dim 128) at batch 1 and 16 and
35K keys per sequence, through
:func:`engine.attention.triton_ops.decode_attention` with the engine's split count; for each KV dtype a
sweep of the stage-1 tile (keys per iteration, warps, pipeline stages). Reports microseconds per call
(CUDA events) and the bytes-per-second that implies for the K/V (+ scales) read. The slots are a random
permutation of the whole pool, the worst locality (the engine reserves each sequence's slots at once, so its
keys sit mostly in runs): absolute times here are slower than in the engine's step (compare
``decode_probe`` in engine_*_h200.json); the sweep ranks tiles and dtypes under the same layout.

Run on the GPU machine:  python3 benchmarks/diag_fp8_decode.py --out benchmarks/results/diag_fp8_decode_h200.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_engine import cuda_ms, json_saver, result_header

from engine.attention.triton_ops import decode_attention, decode_splits_for_fill
from engine.kv import fp8

HQ, HKV, D = 16, 8, 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=35_000)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    res = result_header(args.commit)
    res.update(context=args.context, heads=[HQ, HKV, D], runs=[])
    save = json_saver(res, args.out)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    for bsz in (int(b) for b in args.batches.split(",")):
        n = bsz * args.context
        k = torch.randn(n + 1, HKV, D, generator=gen, device=dev).to(torch.bfloat16)
        v = torch.randn(n + 1, HKV, D, generator=gen, device=dev).to(torch.bfloat16)
        kc, ks = fp8.quantize(k)
        vc, vs = fp8.quantize(v)
        table = (torch.randperm(n, generator=gen, device=dev) + 1).view(bsz, args.context).int()
        table = torch.cat([torch.zeros(1, args.context, dtype=torch.int32, device=dev), table])
        rows = torch.arange(1, bsz + 1, dtype=torch.int32, device=dev)
        lens = torch.full((bsz,), args.context, dtype=torch.int32, device=dev)
        q = torch.randn(bsz, HQ, D, generator=gen, device=dev).to(torch.bfloat16)
        out = torch.empty_like(q)
        fill = decode_splits_for_fill(bsz, HKV, 64)
        po = torch.empty((bsz, HQ, 64, D), dtype=torch.float32, device=dev)
        pl = torch.empty((bsz, HQ, 64), dtype=torch.float32, device=dev)
        ref = None
        for kv, (bn, warps, stages) in itertools.product(("bf16", "fp8"), itertools.product((32, 64, 128), (4, 8), (2, 3, 4))):
            fp = kv == "fp8"
            kb, vb = (kc, vc) if fp else (k, v)
            extra = {"k_scale": ks, "v_scale": vs} if fp else {}

            call = functools.partial(
                decode_attention, q, kb, vb, rows, lens, out, sm_scale=D**-0.5, table=table, fill_splits=fill,
                max_splits=64, min_split_tokens=256, part_o=po, part_lse=pl, block_n=bn, num_warps=warps,
                num_stages=stages, **extra)
            try:
                us = cuda_ms(call, reps=100) * 1e3
            except OutOfResources as e:  # a tile that does not fit (shared memory, registers) is a result too
                res["runs"].append({"batch": bsz, "kv": kv, "block_n": bn, "warps": warps, "stages": stages,
                                    "error": f"{type(e).__name__}: {str(e)[:120]}"})
                continue
            if ref is None:  # the first run (bf16, the engine's tile) is the reference output
                ref = out.clone()
            err = float((out.float() - ref.float()).norm() / ref.float().norm())
            per_key = HKV * D * (1 if fp else 2) * 2 + (HKV * 8 if fp else 0)  # K and V codes (+ scales)
            res["runs"].append({"batch": bsz, "kv": kv, "block_n": bn, "warps": warps, "stages": stages,
                                "us": us, "tb_s": n * per_key / (us * 1e-6) / 1e12, "rel_err_vs_bf16": err})
            print(json.dumps(res["runs"][-1]), flush=True)
        save()
    best = {}
    for r in res["runs"]:
        if "us" in r:
            key = f"b{r['batch']}-{r['kv']}"
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    res["best"] = best
    print(json.dumps(best, indent=1))
    save()


if __name__ == "__main__":
    main()
