"""HTTP pieces the API and the engine server share: the error shape (``errors``) and the engine's Prometheus
series (``engine_metrics``), so that the engine server imports nothing of ``api/``."""
