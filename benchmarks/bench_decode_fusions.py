"""The batch-1 decode fusions of ``engine/ops/triton_fused.py``, predicted vs measured, and their tiles.

At batch 1, Qwen3-0.6B's shapes (MOSS-TD's decoder) and 28 layers' worth of distinct weights (734 MB, so
the L2 cache holds none of them between uses), each variant below is captured as one CUDA graph of its
kernels for every layer and replayed; CUDA events time the replays (median of trials of many replays).
For each fusion the engine runs (``qkv``: add + RMSNorm -> GEMV 4096 x 1024; ``gate_up_swiglu``: add +
RMSNorm -> GEMV 6144 x 1024 -> SwiGLU in the epilogue, each program owning matching gate and up rows) it
reports, per layer (microseconds):

- ``unfused_us``: the chain as the engine runs it without the fusion (our norm kernel, our GEMV, for gate/up
  our SwiGLU kernel: ``engine.ops.linear`` with ``fused_norm_gemv`` off);
- ``removed_kernel_us``: the kernels the fusion removes, alone: the predicted saving; ``gemv_us``: the GEMV;
- ``fused_us``: the fused kernel at its default tile, and ``measured_saving_us`` = unfused - fused;
- ``tiles``: the fused kernel at block rows 1/2/4/8 x warps 1/2/4, each with its largest difference from
  the unfused output (share of differing elements, relative error; a tile counts only within one bf16
  step of relative error), and ``best``.

``step`` puts the three products of all layers (q/k/v, gate/up, down; down is a plain GEMV) with what
precedes them in one graph (the 84 kernels a step loses): unfused, fused at the default tiles, fused at each
fusion's best tile. Bytes per step: weights only.

``results/decode_fusions_h200.json`` was measured at df8d7d1, which also had SwiGLU folded into the down
GEMV's prologue (``down``: each program recomputing its chunk of ``silu(gate) * up``; 0.7 us per layer
slower than the two kernels) and compared the placements in ``step``: the gate/up epilogue won by 62 us per
step, so it is the one kept.

Run on the GPU machine (well under a minute, Triton compiles included):
    python3 benchmarks/bench_decode_fusions.py --commit SHA --out benchmarks/results/decode_fusions_h200.json
Check the logic on the CPU (Triton interpreter, tiny shapes, nothing timed):
    python3 benchmarks/bench_decode_fusions.py --dry-run
"""

# ruff: noqa: B023
# (each lambda runs inside Timer.us before its loop variables change)
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Decoder widths: hidden H, fused q/k/v rows, SwiGLU width I, layers."""

    hidden: int
    qkv: int
    inter: int
    layers: int


FULL = Shapes(hidden=1024, qkv=(16 + 2 * 8) * 128, inter=3072, layers=28)  # Qwen3-0.6B
TINY = Shapes(hidden=64, qkv=128, inter=128, layers=2)  # --dry-run


class Timer:
    """Microseconds per replay of a CUDA graph of ``fn()``; in a dry run ``fn`` runs once, untimed."""

    def __init__(self, dry: bool, reps: int, trials: int) -> None:
        self.dry, self.reps, self.trials = dry, reps, trials

    def us(self, fn) -> float | None:
        if self.dry:
            fn()
            return None
        from bench_engine import graph_us

        return graph_us(fn, self.reps, self.trials)


def _per(total: float | None, n: int) -> float | None:
    return None if total is None else total / n


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _agreement(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """How far ``out`` is from ``ref``: the share of elements that differ and the relative error of the
    vector. Another tile sums each dot product in another order, so a few elements may move one step; the
    vector must stay within one bf16 step (2**-8) of relative error to count as the same result."""
    o, r = out.double(), ref.double()
    return {"differing": float((o != r).double().mean()), "rel_err": float((o - r).norm() / r.norm())}


AGREE = 2.0 ** -8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="")
    ap.add_argument("--commit", default="")
    ap.add_argument("--block-rows", default="1,2,4,8", help="tile sweep: rows of W per program")
    ap.add_argument("--warps", default="1,2,4", help="tile sweep: warps per program")
    ap.add_argument("--reps", type=int, default=50, help="graph replays per timed trial")
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes, no timing")
    args = ap.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated (imported below)
    from engine.ops import triton_fused as tf
    from engine.ops import triton_kernels as tk
    from engine.ops.linear import LinearKernels, add_rms_norm_linear

    t0 = time.perf_counter()
    dev = torch.device("cpu" if args.dry_run else "cuda")
    shp = TINY if args.dry_run else FULL
    if args.dry_run:
        res = {"command": " ".join(sys.argv), "commit": args.commit, "device": "cpu (dry run: interpreter)"}
        unfused_choice = None  # on the CPU the dispatch never reaches a kernel: call the kernels directly
    else:
        from bench_engine import result_header

        res = result_header(args.commit)
        unfused_choice = LinearKernels(gemv_max_rows=1)
    from bench_engine import json_saver

    dt = getattr(torch, args.dtype)
    res.update(dtype=args.dtype, shapes=dataclasses.asdict(shp), pairs={})
    save = json_saver(res, args.out)
    timer = Timer(args.dry_run, args.reps, args.trials)
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(dt)

    L, H = shp.layers, shp.hidden
    x, r, gu = rand(1, H, scale=3.0), rand(1, H), rand(1, 2 * shp.inter, scale=3.0)
    norm_w = [rand(H) + 1.0 for _ in range(L)]
    weights = {"qkv": [rand(shp.qkv, H, scale=0.03) for _ in range(L)],
               "gate_up": [rand(2 * shp.inter, H, scale=0.03) for _ in range(L)],
               "down": [rand(H, shp.inter, scale=0.03) for _ in range(L)]}
    res["weight_bytes_per_step"] = sum(w.numel() * w.element_size() for ws in weights.values() for w in ws)

    # the two fusions the engine runs (qkv: add + RMSNorm -> GEMV; gate_up_swiglu: add + RMSNorm -> gate/up
    # GEMV -> SwiGLU in its epilogue); down stays a plain GEMV
    pairs = {"qkv": "qkv", "gate_up_swiglu": "gate_up"}

    def unfused(pair: str, layer: int) -> torch.Tensor:
        w = weights[pairs[pair]][layer]
        if unfused_choice is None:  # dry run: the kernels directly
            y = tk.gemv(tk.add_rms_norm(x, r, norm_w[layer], EPS)[0], w)
        else:
            y = add_rms_norm_linear(x, r, norm_w[layer], EPS, w, unfused_choice)[0]
        return tk.silu_and_mul(y) if pair == "gate_up_swiglu" else y

    def fused(pair: str, layer: int, tile: tuple[int | None, int | None] = (None, None)) -> torch.Tensor:
        w = weights[pairs[pair]][layer]
        if pair == "gate_up_swiglu":
            return tf.add_rms_norm_gemv_swiglu(x, r, norm_w[layer], EPS, w, *tile)[0]
        return tf.add_rms_norm_gemv(x, r, norm_w[layer], EPS, w, *tile)[0]

    def removed(pair: str, layer: int) -> object:  # the kernels the fusion removes
        n = tk.add_rms_norm(x, r, norm_w[layer], EPS)
        return tk.silu_and_mul(gu) if pair == "gate_up_swiglu" else n

    h_in = tk.add_rms_norm(x, r, norm_w[0], EPS)[0]
    tiles = [(bn, w) for bn in map(int, args.block_rows.split(",")) for w in map(int, args.warps.split(","))]
    if args.dry_run:  # the interpreter runs programs one by one: two tiles show the sweep's logic
        tiles = tiles[-1:] + [(4, 1)]
    best: dict[str, tuple[int, int]] = {}
    for pair, key in pairs.items():
        ws = weights[key]
        k = ws[0].shape[1]
        glu = pair == "gate_up_swiglu"
        ref = unfused(pair, 0)
        row = {"N": ws[0].shape[0], "K": k, "default_tile": list(tf.fused_gemv_tile(k, glu)),
               "unfused_us": _per(timer.us(lambda: [unfused(pair, i) for i in range(L)]), L),
               "removed_kernel_us": _per(timer.us(lambda: [removed(pair, i) for i in range(L)]), L),
               "gemv_us": _per(timer.us(lambda: [tk.gemv(h_in, ws[i]) for i in range(L)]), L),
               "fused_us": _per(timer.us(lambda: [fused(pair, i) for i in range(L)]), L),
               "fused_vs_unfused": _agreement(fused(pair, 0), ref), "tiles": []}
        row["measured_saving_us"] = _sub(row["unfused_us"], row["fused_us"])
        row["predicted_saving_us"] = row["removed_kernel_us"]
        for tile in tiles:
            try:
                agree = _agreement(fused(pair, 0, tile), ref)
                us = _per(timer.us(lambda: [fused(pair, i, tile) for i in range(L)]), L)
            except Exception as e:  # noqa: BLE001 - a tile that does not compile or fit is a result too
                row["tiles"].append({"block_n": tile[0], "warps": tile[1], "error": f"{type(e).__name__}: {e}"[:160]})
                continue
            row["tiles"].append({"block_n": tile[0], "warps": tile[1], "us": us, **agree})
        ok = [t for t in row["tiles"] if "us" in t and t["rel_err"] < AGREE]
        pick = min(ok, key=lambda t: t["us"]) if ok and ok[0]["us"] is not None else None
        best[pair] = (pick["block_n"], pick["warps"]) if pick else tuple(tf.fused_gemv_tile(k, glu))
        row["best"] = {"block_n": best[pair][0], "warps": best[pair][1], "us": pick["us"] if pick else None}
        res["pairs"][pair] = row
        print(pair, json.dumps({k: v for k, v in row.items() if k != "tiles"}), flush=True)
        save()

    def step(kind: str) -> None:  # the three matrix products of every layer with what precedes them
        for i in range(L):
            if kind == "unfused":
                unfused("qkv", i)
                a = unfused("gate_up_swiglu", i)
            else:
                fused("qkv", i, best["qkv"] if kind == "best" else (None, None))
                a = fused("gate_up_swiglu", i, best["gate_up_swiglu"] if kind == "best" else (None, None))
            tk.gemv(a, weights["down"][i])

    st = {kind: timer.us(lambda: step(kind)) for kind in ("unfused", "fused", "best")}
    res["step"] = {
        "unfused_us_per_step": st["unfused"], "fused_us_per_step": st["fused"], "best_us_per_step": st["best"],
        "unfused_us_per_layer": _per(st["unfused"], L), "fused_us_per_layer": _per(st["fused"], L),
        "best_us_per_layer": _per(st["best"], L),
        "measured_saving_us_per_step": _sub(st["unfused"], st["fused"]),
        "best_saving_us_per_step": _sub(st["unfused"], st["best"]),
        "predicted_saving_us_per_step": None if args.dry_run else L * sum(
            res["pairs"][p]["removed_kernel_us"] for p in pairs),
        "best_tiles": {p: list(t) for p, t in best.items()},  # step "best" ran these
        "weights_tb_s_fused": None if st["fused"] is None else res["weight_bytes_per_step"] / st["fused"] / 1e6,
    }
    res["wall_s"] = time.perf_counter() - t0
    print("step", json.dumps(res["step"]), flush=True)
    save()


if __name__ == "__main__":
    main()
