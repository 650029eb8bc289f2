"""Prefill-chunk (extend) attention at long context on the GPU: why a 4,096-token chunk of a 90-minute
prompt costs hundreds of milliseconds. Times ``extend_attention`` for one item with 4,096 new queries over
8K-78K keys (Qwen3-0.6B heads: 16 q / 8 kv x 128, bf16): keys read through a scattered ``req_to_token``
table (as in the engine after churn), through an identity table, and without a table (contiguous slots),
over a few tiles and pipeline depths; torch SDPA (no mask, all keys) on contiguous K/V as the yardstick.

Usage (GPU): python benchmarks/diag_extend.py --commit SHA --out OUT.json
"""

# ruff: noqa: B023
# (each closure runs inside cuda_ms before its loop variables change)
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_engine import cuda_ms, json_saver, result_header
from engine.attention.triton_ops.extend import extend_attention

HQ, HKV, D, EXT = 16, 8, 128, 4096
TILES = [(64, 64, None, 2), (64, 64, 4, 2), (64, 64, 8, 3), (64, 32, 4, 3), (32, 64, 4, 3), (128, 64, 8, 2),
         (64, 128, 8, 2), (128, 32, 8, 3)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--kv", default="8192,32768,77824")
    args = ap.parse_args()
    res = result_header(args.commit)
    res["rows"] = []
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    for kv in [int(x) for x in args.kv.split(",")]:
        slots = kv + 1024
        kb = torch.randn(slots, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        vb = torch.randn(slots, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        q = torch.randn(EXT, HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
        out = torch.empty_like(q)
        i32 = {"device": dev, "dtype": torch.int32}
        rows, kv_lens = torch.zeros(1, **i32), torch.tensor([kv], **i32)
        ext_lens, qo = torch.tensor([EXT], **i32), torch.zeros(1, **i32)
        tables = {"scattered": torch.randperm(slots, device=dev, generator=g)[:kv].to(torch.int32)[None],
                  "identity": torch.arange(kv, **i32)[None]}
        flops = 4 * HQ * D * (EXT * (kv - EXT) + EXT * EXT / 2)  # QK^T and PV over the visible keys
        ref = None
        for name, table in [*tables.items(), ("no table", None)]:
            for bm, bn, warps, stages in TILES:
                def run(table=table, bm=bm, bn=bn, warps=warps, stages=stages):
                    extend_attention(q, kb, vb, out, rows, kv_lens, ext_lens, qo, EXT, sm_scale=D ** -0.5,
                                     table=table, src_len=slots, block_m=bm, block_n=bn, num_warps=warps,
                                     num_stages=stages)
                try:
                    ms = cuda_ms(run, 5)
                except Exception as e:  # noqa: BLE001 - an over-large tile (shared memory): record why, go on
                    res["rows"].append({"kv": kv, "keys": name, "tile": [bm, bn, warps, stages],
                                        "error": f"{type(e).__name__}: {str(e)[:100]}"})
                    continue
                if name == "identity":
                    ref = out.clone() if ref is None else ref
                row = {"kv": kv, "keys": name, "tile": [bm, bn, warps, stages], "ms": ms, "tflops": flops / ms / 1e9}
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
        qs = q.view(1, EXT, HQ, D).transpose(1, 2)
        ks, vs = kb[:kv].view(1, kv, HKV, D).transpose(1, 2), vb[:kv].view(1, kv, HKV, D).transpose(1, 2)
        ms = cuda_ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True), 5)
        row = {"kv": kv, "keys": "torch SDPA, no mask", "ms": ms, "tflops": 4 * HQ * D * EXT * kv / ms / 1e9}
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    json_saver(res, args.out)()


if __name__ == "__main__":
    main()
