"""CUDA graphs of the audio encoder, one per exact window count (1..8 by default).

Why exact counts: one window of Whisper-medium costs ~1.1 TFLOP, so padding 3 windows to a graph of 4
costs a third more work; SGLang-Omni measured +25-85 % encoder time for counts 3/5/9/17 with power-of-two
buckets (sgl-project/sglang-omni #973). A graph removes the ~600 kernel launches of an eager pass,
which dominate at one window.

Each graph computes ``windows float32 [k, 480000] -> states [k, 1500, d]``: the log-mel is inside the
graph when the FFT can be captured (cuFFT supports stream capture), otherwise it runs eagerly and the graph
starts at the mel. Graphs are captured largest first into one private memory pool (they run one at a
time, on the encoder stream), never the decode graphs' pool: the two kinds replay concurrently on
different streams. Before each capture at least ``min_free_bytes`` of device memory must be free,
otherwise that count stays eager (the guard keeps a full KV cache from being squeezed at start).

Optional ``torch.compile`` of the encoder module (default mode, ``dynamic=False``, one specialization per
count, compiled during the warm-up before capture). Never ``mode="reduce-overhead"``: its cudagraph trees
corrupted memory next to other CUDA graphs in SGLang-Omni (#1046).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine.models.mel import CHUNK_SAMPLES

log = logging.getLogger("diarist.engine")

WARMUP = 3


def compile_encoder(encoder: torch.nn.Module, max_specializations: int) -> Callable:
    """``torch.compile(encoder, dynamic=False)`` in the default mode; raises dynamo's recompile limit to
    ``max_specializations`` so no window count silently falls back to eager."""
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), max_specializations + 1))
    return torch.compile(encoder, dynamic=False)


class EncoderGraphs:
    """Captured encoder graphs by window count.

    Args:
        mel_fn: ``windows float32 [k, 480000] -> mel [k, n_mels, 3000]`` in the encoder's dtype.
        encoder_fn: ``mel -> states [k, 1500, d]`` (the module, or its compiled form).
        device: the CUDA device.
        buckets: window counts to capture (exact; a count without a graph runs eagerly).
        min_free_bytes: free device memory required before each capture.
    """

    def __init__(self, mel_fn: Callable, encoder_fn: Callable, device: torch.device, buckets: list[int],
                 min_free_bytes: int = 3 << 30) -> None:
        self.mel_fn = mel_fn
        self.encoder_fn = encoder_fn
        self.device = device
        self.buckets = sorted({int(b) for b in buckets if int(b) > 0})
        self.min_free_bytes = min_free_bytes
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.mel_in_graph = True
        self.skipped: list[int] = []
        self.replays = 0

    def __contains__(self, k: int) -> bool:
        return k in self.graphs

    def _fn(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder_fn(self.mel_fn(x) if self.mel_in_graph else x)

    @torch.inference_mode()
    def capture(self, stream: torch.cuda.Stream | None = None) -> None:
        """Warm up and capture every bucket, largest first. The log-mel goes into the graphs unless its
        capture fails, in which case all graphs start at the mel.

        Raises: RuntimeError from CUDA when even the mel-less capture fails.
        """
        if not self.buckets:
            return
        try:
            self._capture_all(stream)
        except RuntimeError as e:  # e.g. an FFT that cannot be captured on this stack
            log.warning("encoder graph capture with the mel failed (%s); capturing from the mel", e)
            self.graphs.clear()
            torch.cuda.synchronize(self.device)
            self.mel_in_graph = False
            self._capture_all(stream)
        log.info("captured encoder CUDA graphs for window counts %s (mel in graph: %s; skipped %s)",
                 sorted(self.graphs), self.mel_in_graph, self.skipped)

    def _capture_all(self, stream: torch.cuda.Stream | None) -> None:
        kmax = self.buckets[-1]
        if self.mel_in_graph:
            self.input = torch.zeros(kmax, CHUNK_SAMPLES, dtype=torch.float32, device=self.device)
        else:
            self.input = self.mel_fn(torch.zeros(kmax, CHUNK_SAMPLES, device=self.device))
        side = stream or torch.cuda.Stream(self.device)
        pool = None
        self.skipped = []
        for k in reversed(self.buckets):
            free, _ = torch.cuda.mem_get_info(self.device)
            if free < self.min_free_bytes:
                self.skipped.append(k)
                continue
            x = self.input[:k]
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP):  # cuBLAS/cuFFT plans, SDPA kernels, compile specializations
                    self._fn(x)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            # Own capture stream: cuBLAS keys its workspace by stream, and torch.cuda.graph's shared default
            # capture stream would give these graphs the decode graphs' workspace while both replay at once.
            with torch.cuda.graph(graph, pool=pool, stream=side):
                out = self._fn(x)
            pool = graph.pool()
            self.graphs[k] = (graph, out)
        torch.cuda.synchronize(self.device)

    def __call__(self, windows: torch.Tensor) -> torch.Tensor:
        """Replay the graph of ``k = windows.shape[0]`` on the current stream.

        Args:
            windows: float32 ``[k, 480000]`` on the device, ``k`` captured (see ``in``).
        Returns:
            states ``[k, 1500, d]``: a view of the graph's static output, valid until the next replay of any
            encoder graph on this stream (copy it out first).
        """
        k = windows.shape[0]
        graph, out = self.graphs[k]
        self.input[:k].copy_(windows if self.mel_in_graph else self.mel_fn(windows))
        graph.replay()
        self.replays += 1
        return out
