"""Decode graphs are captured on a stream of their own, never on ``torch.cuda.graph``'s process-wide default
capture stream (PyTorch keys the cuBLAS workspace by the capture stream, so graphs captured on one stream
share a workspace; the encoder graphs are captured on the default one and replay concurrently on the
encoder stream). CUDA itself is replaced by stand-ins that record what capture was asked for, so this runs
on the CPU; the concurrent-replay check on the device is ``benchmarks/diag_stall.py --modes race,legacy``."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from engine.cuda_graph import DecodeGraphs


class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        pass


class _Graph:
    def pool(self) -> tuple[int, int]:
        return (0, 1)


class _Attn:
    """Static metadata like TritonBackend's, without kernels."""

    def init_graph_capture(self, max_batch_size: int) -> None:
        self.loc = torch.zeros(max_batch_size, dtype=torch.int64)

    def prepare_for_capture(self, batch_size: int) -> None:
        self.meta = SimpleNamespace(loc=self.loc[:batch_size])


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, batch, attn) -> torch.Tensor:
        return self.emb(batch.input_ids).float()


def test_decode_graphs_capture_on_their_own_stream(monkeypatch):
    captures = []

    @contextlib.contextmanager
    def graph(cuda_graph, pool=None, stream=None, **kwargs):
        captures.append((stream, pool))
        yield

    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    graphs = DecodeGraphs(_Model(), _Attn(), torch.device("cpu"), max_batch_size=8)
    graphs.capture()

    assert sorted(graphs.graphs) == [1, 2, 4, 8]
    assert len(captures) == 4
    streams = {id(s) for s, _ in captures}
    assert None not in {s for s, _ in captures}, "captured on torch.cuda.graph's shared default stream"
    assert streams == {id(graphs.capture_stream)}
