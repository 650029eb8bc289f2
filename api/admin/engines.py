"""Engine stats for the dashboard and the API's ``/metrics``: ``{engine key: stats dict | None}``.

Where they come from, first match wins:
1. ``app.state.engine_stats`` — a callable returning the mapping (embedded mode: the engine is in-process,
   keyed by its in-process id);
2. ``GET <url>/stats`` of each engine server in ``DIARIST_ADMIN_ENGINE_URLS`` (default those of
   ``DIARIST_ENGINE_URL``), all at once, ``engine_timeout_s`` each, keyed by that configured URL whether
   it answers or not (an engine that does not answer maps to None, shown as down). The key is the engine's
   identity for ``diarist_engine_up{engine}`` and the dashboard, so it must not change with the engine's
   state; the id the server reports for itself stays in its stats (``engine_id``), which is how workers
   name an engine too (``engine_server.client``: the URL). Answers are cached for ``CACHE_S`` so many open
   dashboards cost one round.

The stats dict is ``engine.Engine.stats()`` (``running_requests``, ``waiting_requests``,
``kv_used_fraction``, ``tokens_per_s``, counters…) plus, when the engine reports them,
``cuda_graph_replays`` and ``encoder_cache_hits`` / ``encoder_cache_misses``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api.admin.config import get_admin_settings

CACHE_S = 2.0
_lock = threading.Lock()
_cache: dict[tuple[str, ...], tuple[float, dict[str, dict | None]]] = {}


def _fetch(url: str, timeout_s: float) -> dict | None:
    import httpx

    try:
        r = httpx.get(f"{url.rstrip('/')}/stats", timeout=timeout_s)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def engine_urls(app: Any) -> list[str]:
    conf = get_admin_settings()
    if conf.engine_urls is not None:
        return list(conf.engine_urls)
    st = app.state.services.settings
    return [] if st.embedded else list(st.engine_url)


def engine_stats(app: Any) -> dict[str, dict | None]:
    """Stats of every known engine (see the module doc); {} when none is configured."""
    local = getattr(app.state, "engine_stats", None)
    if callable(local):
        return dict(local())
    urls = tuple(engine_urls(app))
    if not urls:
        return {}
    now = time.monotonic()
    with _lock:
        hit = _cache.get(urls)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
    timeout = get_admin_settings().engine_timeout_s
    with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
        answers = list(pool.map(lambda u: _fetch(u, timeout), urls))
    out = dict(zip(urls, answers, strict=True))  # by URL, up or down: one stable key per engine (module doc)
    with _lock:
        _cache[urls] = (now, out)
    return out


def summary(stats: dict[str, dict | None]) -> list[dict[str, Any]]:
    """Rows for the overview table: id (the key of ``stats``), the id the engine reports for itself
    (``engine_id``, None when it does not report one or is down), up, running, waiting, KV used %,
    tokens/s, encoder cache hit rate."""
    rows = []
    for eid, st in sorted(stats.items()):
        if st is None:
            rows.append({"id": eid, "engine_id": None, "up": False})
            continue
        hits, misses = st.get("encoder_cache_hits"), st.get("encoder_cache_misses")
        rate = hits / (hits + misses) if hits is not None and misses is not None and hits + misses > 0 else None
        rows.append({"id": eid, "engine_id": st.get("engine_id"), "up": True, "model": st.get("model"),
                     "device": st.get("device"), "running": st.get("running_requests"),
                     "waiting": st.get("waiting_requests"),
                     "kv_used_pct": 100.0 * float(st.get("kv_used_fraction") or 0.0),
                     "kv_tokens_total": st.get("kv_tokens_total"),
                     "tokens_per_s": float(st.get("tokens_per_s") or 0.0),
                     "cuda_graph_replays": st.get("cuda_graph_replays"), "encoder_cache_hit_rate": rate})
    return rows
