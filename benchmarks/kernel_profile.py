"""GPU kernel time of one callable, per kernel and per kind of kernel (torch.profiler, CUDA activity only).

Kernels are grouped by their full name (a name cut short merged different template instances, e.g. the
strided copy and the strided add of ``at::native::elementwise_kernel<128, 4, ...>``), with calls and device
microseconds per call of ``fn``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# (kind, substrings of the kernel name), first match wins; names as cuBLAS/cuDNN/ATen/Triton print them
KINDS: list[tuple[str, tuple[str, ...]]] = [
    ("conv", ("fprop_implicit_gemm", "nchwToNhwc", "nhwcToNchw", "conv")),
    ("attention", ("sdpa", "flash", "fmha", "attention")),
    ("gemm", ("nvjet", "gemm", "cutlass", "sm90_xmma")),
    ("layer_norm", ("layer_norm",)),
    ("gelu", ("Gelu", "gelu")),
    ("fft / mel", ("fft", "r2c", "c2r")),
    ("memset / memcpy", ("Memset", "Memcpy")),
    ("elementwise (vectorized)", ("vectorized_elementwise_kernel",)),
    ("elementwise (strided: copies, non-contiguous ops)", ("elementwise_kernel", "copy")),
    ("reduction", ("reduce_kernel",)),
]


def kind(name: str) -> str:
    """The kind of a kernel name (:data:`KINDS`), else ``"other"``."""
    for k, subs in KINDS:
        if any(s in name for s in subs):
            return k
    return "other"


def kernel_table(fn: Callable[[], object], reps: int = 3) -> dict:
    """Profile ``reps`` calls of ``fn`` (after one unprofiled call) on the current CUDA device.

    Returns ``{"kernels": [{"kernel", "kind", "calls", "us"}, ...] (per call of fn, longest first),
    "by_kind_us": {kind: us}, "total_us": float}``; kernel names cut to 160 characters after grouping.
    """
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_time_total > 0:
            rows.append({"kernel": e.key[:160], "kind": kind(e.key), "calls": e.count / reps,
                         "us": round(e.device_time_total / reps, 1)})
    rows.sort(key=lambda r: -r["us"])
    by_kind: dict[str, float] = {}
    for r in rows:
        by_kind[r["kind"]] = round(by_kind.get(r["kind"], 0.0) + r["us"], 1)
    return {"kernels": rows, "by_kind_us": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "total_us": round(sum(r["us"] for r in rows), 1)}


def markdown(title: str, tables: dict[str, dict], top: int = 16) -> list[str]:
    """Markdown lines: time by kind for each profiled callable side by side, then each one's ``top``
    kernels. ``tables``: label -> :func:`kernel_table` result."""
    labels = list(tables)
    kinds = sorted({k for t in tables.values() for k in t["by_kind_us"]},
                   key=lambda k: -max(t["by_kind_us"].get(k, 0.0) for t in tables.values()))
    out = ["", f"## {title}", "", "| kind (us per forward) | " + " | ".join(labels) + " |",
           "|---" * (len(labels) + 1) + "|"]
    out += [f"| {k} | " + " | ".join(f"{tables[lb]['by_kind_us'].get(k, 0.0):.0f}" for lb in labels) + " |"
            for k in kinds]
    out.append("| total | " + " | ".join(f"{tables[lb]['total_us']:.0f}" for lb in labels) + " |")
    for lb in labels:
        out += ["", f"{lb}, top {top} kernels:", "", "| kernel | kind | calls | us |", "|---|---|---|---|"]
        out += [f"| `{r['kernel'][:90]}` | {r['kind']} | {r['calls']:g} | {r['us']:.0f} |"
                for r in tables[lb]["kernels"][:top]]
    return out
