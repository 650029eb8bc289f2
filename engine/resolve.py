"""Resolve an :class:`~engine.config.EngineConfig` from the device and the checkpoint: the one place that
decides dtype, attention backend, graphs, async decode and kernel choices (docs/service.md, "The engine on a GPU").

Every entry point (``diarist engine``, the embedded stack, ``transcribe``, ``eval``, the benchmarks) builds
an ``EngineConfig`` whose unset (``None``) fields mean "what this device does best", and
:class:`engine.Engine` resolves it here, so the speed a benchmark reports is the speed users get.

On CUDA: bfloat16 (float16 or bfloat16 when the checkpoint stores that), Triton attention, decode and
prefill CUDA graphs, async decode, the encoder stream with its graphs and cache, the Triton GEMV for
single-row steps and the fused GELU GEMM. On the CPU: float32 and the torch reference backend.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path

import torch

from engine.attention import BACKENDS, supports_cuda_graphs
from engine.config import DTYPES, FAMILIES, DeviceUnavailable, EngineConfig
from engine.kv.fp8 import FP8_DTYPE, kv_storage_dtype


def default_cpu_threads() -> int:
    """Intra-op threads for the CPU engine: half the cores (at least 1).

    The engine shares the CPU with VAD, speaker embeddings, the API and workers. OpenMP threads spin while
    they wait, so an oversubscribed pool turns the decoder's many tiny ops into waits: on 2 busy cores,
    2 threads made tiny.en decoding 5-13x slower than 1 thread (measured here, benchmarks/bench_cpu.py).
    """
    return max(1, (os.cpu_count() or 2) // 2)


def check_device(name: str) -> torch.device:
    """The ``torch.device`` for ``name`` if the engine can run on it here (``meta`` too: shapes only, for
    memory-plan tests).

    Raises:
        DeviceUnavailable: not ``cpu`` / ``cuda`` / ``cuda:N``, CUDA absent, or no GPU ``N``.
    """
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise DeviceUnavailable(f"device {name!r} is not one the engine runs on (cpu, cuda or cuda:N)") from None
    if dev.type in ("cpu", "meta"):
        return dev
    if dev.type != "cuda":
        raise DeviceUnavailable(f"device {name!r} is not one the engine runs on (cpu, cuda or cuda:N)")
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"device {name!r}: CUDA is not available on this machine")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise DeviceUnavailable(f"device {name!r}: this machine has {count} CUDA device(s)")
    return dev


def checkpoint_dtype(cfg: EngineConfig) -> str | None:
    """The floating dtype the checkpoint stores (``"float16"``/``"bfloat16"``/``"float32"``), or ``None``
    when unknown (dummy weights, no readable config). Reads only headers: ``config.json``'s ``dtype`` /
    ``torch_dtype`` for Hugging Face folders, the variable headers of a CTranslate2 ``model.bin``."""
    if cfg.load_format == "dummy":
        return None
    family = FAMILIES.get(cfg.model)
    packaged_family = family is not None and family.packaged_checkpoints  # a bundled default, names for paths
    if cfg.model_path is None:
        if not packaged_family:
            return None
        from engine.loaders.registry import bundled_whisper_dir

        path = bundled_whisper_dir()
    else:
        path = Path(cfg.model_path)
        from engine.checkpoints import packaged_whisper

        packaged = packaged_whisper(cfg.model_path) if packaged_family and not path.is_dir() else None
        if packaged is not None and packaged.sources:  # split over packages: no model.bin on disk
            return packaged.dtype
    if (path / "model.bin").is_file() and cfg.load_format in ("auto", "ct2"):
        return _ct2_dtype(path / "model.bin")
    conf_path = path / "config.json"
    if not conf_path.is_file():
        return None
    try:
        conf = json.loads(conf_path.read_text())
    except (OSError, ValueError):
        return None
    for c in (conf, conf.get("text_config") or {}):
        name = c.get("dtype") or c.get("torch_dtype")
        if name in DTYPES:
            return name
    return None


_CT2_FLOATS = {0: "float32", 4: "float16", 5: "bfloat16"}  # CTranslate2 DataType ids (engine.loaders.ct2)


def _ct2_dtype(path: Path) -> str | None:
    """The float dtype holding most bytes of a CTranslate2 ``model.bin`` (headers only; format in
    :mod:`engine.loaders.ct2`); ``None`` if the file cannot be read."""
    sizes: dict[str, int] = {}
    try:
        with path.open("rb") as f:
            def take(fmt: str) -> tuple:
                raw = f.read(struct.calcsize(fmt))
                if len(raw) != struct.calcsize(fmt):
                    raise EOFError
                return struct.unpack(fmt, raw)

            def skip_str() -> None:
                (n,) = take("<H")
                f.seek(n, 1)

            (version,) = take("<I")
            if version < 5:
                return None
            skip_str()
            take("<I")
            (count,) = take("<I")
            for _ in range(count):
                skip_str()
                (rank,) = take("<B")
                if rank:
                    take(f"<{rank}I")
                (dtype_id,) = take("<B")
                (nbytes,) = take("<I")
                f.seek(nbytes, 1)
                if dtype_id in _CT2_FLOATS:
                    sizes[_CT2_FLOATS[dtype_id]] = sizes.get(_CT2_FLOATS[dtype_id], 0) + nbytes
    except (OSError, EOFError, struct.error):
        return None
    return max(sizes, key=sizes.get) if sizes else None


def resolve_config(cfg: EngineConfig) -> EngineConfig:
    """A copy of ``cfg`` with every ``None`` choice filled for its device and checkpoint, and the explicit
    ones checked.

    Raises:
        DeviceUnavailable: see :func:`check_device`.
        ValueError: unknown dtype or backend. (Triton on the CPU is allowed: the kernel tests run it under
            ``TRITON_INTERPRET=1``.)
    """
    dev = check_device(cfg.device)
    cuda = dev.type == "cuda"
    dtype = cfg.dtype
    if dtype is None:
        stored = checkpoint_dtype(cfg) if cuda else None
        dtype = stored if stored in ("float16", "bfloat16") else ("bfloat16" if cuda else "float32")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    backend = cfg.attention_backend or ("triton" if cuda else "torch")
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r} (expected one of {', '.join(BACKENDS)})")
    check_kv_dtype(cfg.kv_dtype, dev)
    return dataclasses.replace(
        cfg, dtype=dtype, attention_backend=backend,
        async_decode=cfg.async_decode if cfg.async_decode is not None else cuda,
        small_batch_gemv=cfg.small_batch_gemv if cfg.small_batch_gemv is not None else cuda,
        fused_decode_gemv=cfg.fused_decode_gemv if cfg.fused_decode_gemv is not None else cuda,
        fused_gelu_gemm=cfg.fused_gelu_gemm if cfg.fused_gelu_gemm is not None else cuda,
        cuda_graph_max_bs=cfg.cuda_graph_max_bs if cuda and supports_cuda_graphs(backend) else 0,
        encoder_stream=cfg.encoder_stream and cuda, priority_stream=cfg.priority_stream and cuda,
        admission_limits=dict(cfg.admission_limits),
    )


class KVDtypeUnsupported(DeviceUnavailable):
    """The device cannot store the requested KV dtype (``fp8_e4m3`` on a GPU below compute capability 8.9:
    A100, V100, T4). ``code`` is ``"kv_dtype_unsupported"``. A :class:`DeviceUnavailable`, so every entry
    point that prints a missing device as one line with exit status 2 prints this one the same way (a bare
    ValueError was a traceback from ``diarist engine`` and ``bad_model`` from ``transcribe``)."""

    code = "kv_dtype_unsupported"


def check_kv_dtype(kv_dtype: str, dev: torch.device) -> None:
    """Check that this engine can store ``kv_dtype`` on ``dev``.

    Raises:
        ValueError: ``kv_dtype`` is not one of :data:`engine.config.KV_DTYPES`.
        KVDtypeUnsupported: FP8 on a GPU that does not convert e4m3 (compute capability below 8.9; Triton has
            no e4m3 below it).
    """
    if kv_storage_dtype(kv_dtype, torch.float32) == FP8_DTYPE and dev.type == "cuda":  # raises on unknown
        cap = torch.cuda.get_device_capability(dev)
        if cap < (8, 9):
            raise KVDtypeUnsupported(f"kv_dtype fp8_e4m3 needs compute capability 8.9 or newer; {dev} has "
                             f"{cap[0]}.{cap[1]}")


def describe(cfg: EngineConfig) -> dict:
    """The resolved choices users ask about (``/stats``, the startup log line): dtype, backend, graphs,
    async decode, encoder stage, kernel choices, limits."""
    keys = ("device", "dtype", "kv_dtype", "attention_backend", "cuda_graph_max_bs", "prefill_graph_tokens", "async_decode",
            "small_batch_gemv", "fused_decode_gemv", "fused_gelu_gemm", "extend_large_tile_min_tokens",
            "decode_single_split_programs_per_sm", "encoder_stream", "priority_stream", "encoder_graph_buckets",
            "encoder_cache_entries", "encoder_compile", "chunk_size", "max_running_requests", "admission_limits")
    out = {k: getattr(cfg, k) for k in keys}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
