"""Decode attention of a whole step (28 layers) in the engine's KV layout: stage-1 tiles, bf16 vs FP8 KV.

(``results/diag_decode_tiles_h200.json`` was made at 8d1b74c, which also swept how FP8 products ran:
``fp8_dot`` 0 widened the codes to bf16, 1 to float16, 2 quantised q for e4m3 x e4m3 scores; 1 was kept.
``results/diag_decode_merge_fma_h200.json``, at 9734c2f, swept a split merge fused into stage 1 and products
on the CUDA cores; neither was kept.)

MOSS-TD's decoder attention (16 query heads, 8 KV heads, head_dim 128), 28 layers of their own K/V (so L2
holds none of it), at batch 1 and 16 and 35K keys per sequence. Each sequence's keys sit in one run of
slots, as the engine's admission reserves them in a fresh pool (``--layout random`` permutes the slots: the
worst locality, what the ninth session's ``diag_fp8_decode.py`` measured one layer at a time,
``results/archive/diag_fp8_decode_h200_bc13b4d.json``). Every variant is captured as one CUDA graph of the
28 layers' :func:`engine.attention.triton_ops.decode_attention` calls and replayed: microseconds per layer
(the graph's time / 28, so the second kernel's launch is counted as in a decode graph) and the K/V (+ scale)
bytes per second that implies. Output error against the bf16 engine tile's output.

Run on the GPU machine:  python3 benchmarks/diag_decode_tiles.py --commit SHA --out FILE
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_engine import graph_us, json_saver, result_header

from engine.attention.triton_ops import DecodeTile, decode_attention, decode_splits_for_fill
from engine.kv import fp8

HQ, HKV, D, LAYERS, MAX_SPLITS = 16, 8, 128, 28, 64

# (block_n, warps, stages); the first bf16 one is the reference output
BF16_TILES = [(64, 4, 2), (64, 4, 3), (128, 4, 3), (32, 4, 3)]
FP8_TILES = [(32, 4, 3), (64, 4, 3), (128, 4, 3), (64, 8, 3), (128, 8, 3), (128, 4, 4)]


def _step(c: dict, tile: DecodeTile, fp: bool) -> None:
    """One decode step's 28 attention calls over the layers' K/V in ``c`` (layers cycle if fewer)."""
    for i in range(LAYERS):
        j = i % len(c["k"])
        kb, vb = (c["k8"][j][0], c["v8"][j][0]) if fp else (c["k"][j], c["v"][j])
        extra = {"k_scale": c["k8"][j][1], "v_scale": c["v8"][j][1]} if fp else {}
        decode_attention(c["q"], kb, vb, c["rows"], c["lens"], c["outs"][j], sm_scale=D**-0.5, table=c["table"],
                         fill_splits=c["fill"], max_splits=MAX_SPLITS, min_split_tokens=256, part_o=c["po"],
                         part_lse=c["pl"], block_n=tile.block_n, num_warps=tile.num_warps,
                         num_stages=tile.num_stages, **extra)


def _case(bsz: int, context: int, layout: str, gen: torch.Generator) -> dict:
    dev = gen.device
    n = bsz * context
    layers = max(2, min(LAYERS, (24 << 30) // (n * HKV * D * 2 * 2)))  # <= 24 GiB of bf16 K/V
    k = [torch.randn(n + 1, HKV, D, generator=gen, device=dev).to(torch.bfloat16) for _ in range(layers)]
    v = [torch.randn(n + 1, HKV, D, generator=gen, device=dev).to(torch.bfloat16) for _ in range(layers)]
    slots = torch.arange(n, device=dev) if layout == "runs" else torch.randperm(n, generator=gen, device=dev)
    q = torch.randn(bsz, HQ, D, generator=gen, device=dev).to(torch.bfloat16)
    return {
        "k": k, "v": v, "k8": [fp8.quantize(x) for x in k], "v8": [fp8.quantize(x) for x in v], "q": q,
        "table": torch.cat([torch.zeros(1, context, dtype=torch.int32, device=dev),
                            (slots + 1).view(bsz, context).int()]),
        "rows": torch.arange(1, bsz + 1, dtype=torch.int32, device=dev),
        "lens": torch.full((bsz,), context, dtype=torch.int32, device=dev),
        "outs": [torch.empty_like(q) for _ in range(layers)], "fill": decode_splits_for_fill(bsz, HKV, MAX_SPLITS),
        "po": torch.empty((bsz, HQ, MAX_SPLITS, D), dtype=torch.float32, device=dev),
        "pl": torch.empty((bsz, HQ, MAX_SPLITS), dtype=torch.float32, device=dev),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=35_000)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--layout", choices=("runs", "random"), default="runs")
    ap.add_argument("--kv", default="bf16,fp8")
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    res = result_header(args.commit)
    res.update(context=args.context, heads=[HQ, HKV, D], layers=LAYERS, layout=args.layout, runs=[])
    save = json_saver(res, args.out)
    gen = torch.Generator(device="cuda").manual_seed(0)
    kvs = args.kv.split(",")
    variants = [("bf16", DecodeTile(bn, w, st)) for bn, w, st in BF16_TILES] if "bf16" in kvs else []
    variants += [("fp8", DecodeTile(bn, w, st)) for bn, w, st in FP8_TILES if "fp8" in kvs]
    for bsz in (int(b) for b in args.batches.split(",")):
        c = _case(bsz, args.context, args.layout, gen)
        n = bsz * args.context
        ref = None
        for kv, tile in variants:
            fp = kv == "fp8"
            row = {"batch": bsz, "kv": kv, "block_n": tile.block_n, "warps": tile.num_warps,
                   "stages": tile.num_stages, "fill": c["fill"],
                   "layers_of_kv": len(c["k"])}
            try:
                us = graph_us(functools.partial(_step, c, tile, fp), reps=20) / LAYERS
            except Exception as e:  # noqa: BLE001 - a tile that does not fit or compile is a result too  # a tile that does not fit is a result too
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                res["runs"].append(row)
                print(json.dumps(row), flush=True)
                continue
            out = c["outs"][0].float()
            if ref is None:  # the first variant (bf16, the engine's tile) is the reference
                ref = out.clone()
            per_key = HKV * D * (1 if fp else 2) * 2 + (HKV * 8 if fp else 0)  # K and V codes (+ scales)
            row.update(us_per_layer=us, tb_s=n * per_key / (us * 1e-6) / 1e12,
                       rel_err_vs_bf16=float((out - ref).norm() / ref.norm()))
            res["runs"].append(row)
            print(json.dumps(row), flush=True)
        del c
        torch.cuda.empty_cache()
        save()
    best = {}
    for r in res["runs"]:
        if "us_per_layer" in r:
            key = f"b{r['batch']}-{r['kv']}"
            if key not in best or r["us_per_layer"] < best[key]["us_per_layer"]:
                best[key] = r
    res["best"] = best
    print(json.dumps(best, indent=1))
    save()


if __name__ == "__main__":
    main()
