"""Prometheus metrics of an engine, served by the engine server and the API alike (prometheus-client).

Engine server (:func:`engine_metrics_router`), label ``engine`` (its own id there):
  diarist_engine_up, diarist_engine_info{engine_id,model,device}, diarist_engine_running_requests,
  diarist_engine_waiting_requests, diarist_engine_kv_cache_usage_ratio, diarist_engine_kv_cache_capacity_tokens,
  diarist_engine_kv_cache_used_tokens, diarist_engine_tokens_per_second (last 10 s),
  diarist_engine_{steps,prefill_tokens,decode_tokens,requests_finished,request_errors,cuda_graph_replays,
  encoder_cache_hits,encoder_cache_misses}_total.
The API (``api.metrics``) serves the same series for every engine it watches. Names follow
https://prometheus.io/docs/practices/naming/.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)
ENGINE_COUNTERS = (("steps", "steps", "Engine steps (one forward pass each)."),
                   ("prefill_tokens", "prefill_tokens", "Prompt tokens prefilled."),
                   ("decode_tokens", "decode_tokens", "Tokens decoded."),
                   ("finished", "requests_finished", "Requests that left the engine."),
                   ("errors", "request_errors", "Requests ended by an engine error."),
                   ("cuda_graph_replays", "cuda_graph_replays", "Decode steps replayed from a CUDA graph."),
                   ("encoder_cache_hits", "encoder_cache_hits", "Encoder windows served from the cache."),
                   ("encoder_cache_misses", "encoder_cache_misses", "Encoder windows computed."))


def engine_snapshot(engine: Any) -> dict[str, Any]:
    """``engine.stats()`` plus the decode CUDA-graph replay count when the runner has graphs."""
    stats = dict(engine.stats())
    graphs = getattr(getattr(engine, "runner", None), "graphs", None)
    if "cuda_graph_replays" not in stats:
        stats["cuda_graph_replays"] = int(getattr(graphs, "replays", 0) or 0)
    return stats


class EngineCollector:
    """Engine gauges and counters from ``source() -> {engine key: stats | None}`` (None: not answering).

    The key is the ``engine`` label of every series, so it must be the same whether the engine is up or down
    (:func:`api.admin.engines.engine_stats`: the configured URL); the engine's own name (``stats["engine_id"]``,
    else the key) is only the ``engine_id`` label of ``diarist_engine_info``.
    """

    def __init__(self, source: Callable[[], dict[str, dict | None]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self.source()
        except Exception:  # the scrape still answers, without engine series; the log says why
            log.exception("engine stats for /metrics failed")
            stats = {}
        lab = ["engine"]
        up = GaugeMetricFamily("diarist_engine_up", "1 when the engine answered its stats.", labels=lab)
        info = GaugeMetricFamily("diarist_engine_info", "The engine's own id, its model and device.",
                                 labels=["engine", "engine_id", "model", "device"])
        gauges = {k: GaugeMetricFamily(f"diarist_engine_{n}", d, labels=lab) for k, n, d in (
            ("running_requests", "running_requests", "Requests being prefilled or decoded."),
            ("waiting_requests", "waiting_requests", "Requests waiting for admission (KV, batch slots)."),
            ("kv_used_fraction", "kv_cache_usage_ratio", "Fraction of KV cache token slots in use."),
            ("kv_tokens_total", "kv_cache_capacity_tokens", "KV cache size in token slots."),
            ("kv_tokens_used", "kv_cache_used_tokens", "KV cache token slots in use."),
            ("tokens_per_s", "tokens_per_second", "Tokens processed per second over the last 10 s."))}
        counters = {k: CounterMetricFamily(f"diarist_engine_{n}", d, labels=lab) for k, n, d in ENGINE_COUNTERS}
        for eid, st in sorted(stats.items()):
            up.add_metric([eid], 0 if st is None else 1)
            if st is None:
                continue
            own_id = str(st.get("engine_id") or eid)
            info.add_metric([eid, own_id, str(st.get("model")), str(st.get("device"))], 1)
            for k, fam in gauges.items():
                if st.get(k) is not None:
                    fam.add_metric([eid], float(st[k]))
            for k, fam in counters.items():
                if st.get(k) is not None:
                    fam.add_metric([eid], float(st[k]))
        yield up
        yield info
        yield from gauges.values()
        yield from counters.values()


def registry(*collectors: Any) -> CollectorRegistry:
    """A registry of ``collectors`` plus the process and platform collectors."""
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    for c in collectors:
        reg.register(c)
    return reg


def exposition(reg: CollectorRegistry) -> Response:
    """``reg`` in the Prometheus text exposition format."""
    return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)



def engine_metrics_router(engine: Any, engine_id: str) -> APIRouter:
    """``GET /metrics`` for the engine server: ``app.include_router(engine_metrics_router(engine, engine_id))``."""
    reg = registry(EngineCollector(lambda: {engine_id: engine_snapshot(engine)}))
    r = APIRouter(tags=["metrics"])

    @r.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
    def metrics() -> Response:
        return exposition(reg)

    return r
