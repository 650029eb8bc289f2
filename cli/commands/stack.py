"""The embedded stack: API + in-process Celery worker threads + SQLite + local store + in-process engine.

One process, no external servers (docs/service.md, "Embedded"); the same code paths as production:
HTTP → ``api`` → object store + job row → Celery (``memory://``) → ``worker`` → engine → transcript.
Used by ``diarist serve --embedded``, ``diarist demo`` and the service tests.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from diarist.settings import Settings

log = logging.getLogger("diarist")


def embedded_settings(base: Settings | None = None, **overrides: Any) -> Settings:
    """``base`` (default: the environment) with ``embedded=True`` and ``overrides`` applied."""
    base = base or Settings()
    return type(base).model_validate({**base.model_dump(), "embedded": True, **overrides})


def _webhook_secret(settings: Settings) -> str:
    """The settings' secret, else one generated once and kept in ``data_dir/webhook_secret`` (mode 0600)."""
    if settings.webhook_secret:
        return settings.webhook_secret
    from diarist.apikeys import new_webhook_secret

    path = Path(settings.data_dir) / "webhook_secret"
    if path.is_file():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = new_webhook_secret()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


class EmbeddedStack:
    """Start and stop the whole service in this process.

    Args:
        settings: embedded settings (see :func:`embedded_settings`).
        engine: an already loaded ``engine.Engine`` to share (tests); else one is loaded from the settings.
        worker_concurrency: Celery worker threads (default: the sum of the per-class settings).
        fixed_output_tokens: benchmark-only (``benchmarks/bench_service_gpu.py``): the transcriber's switch
            for dummy MOSS-TD weights (:class:`transcription.transcriber.Transcriber`).
    """

    def __init__(self, settings: Settings, engine: Any = None, worker_concurrency: int | None = None,
                 fixed_output_tokens: int | None = None) -> None:
        self.settings = settings
        self.engine = engine
        self.fixed_output_tokens = fixed_output_tokens
        self._own_engine_loop = False
        self.worker_concurrency = worker_concurrency
        self.services = None
        self.worker = None
        self.app = None
        self.server = None
        self.server_thread: threading.Thread | None = None
        self.url: str | None = None

    def start(self) -> EmbeddedStack:
        """Migrate the database, load the engine, start the worker threads, build the app (no HTTP yet)."""
        from api.app import create_app
        from diarist.services import Services
        from engine import Engine
        from engine_server.client import InProcessEngineClient
        from transcription.transcriber import Transcriber
        from worker.embedded import EmbeddedWorker

        st = self.settings
        Path(st.data_dir).mkdir(parents=True, exist_ok=True)
        self.settings = st = type(st).model_validate({**st.model_dump(), "webhook_secret": _webhook_secret(st)})
        if self.engine is None:  # first: a missing device or model fails before anything is opened
            self.engine = Engine(st.engine_config())
        self.services = Services.from_settings(st, migrate=True)
        if getattr(self.engine, "_thread", None) is None:
            self.engine.start()
            self._own_engine_loop = True
        client = InProcessEngineClient(Transcriber(self.engine, fixed_output_tokens=self.fixed_output_tokens))
        self.services.voices = client  # enrollment samples are embedded by the same in-process model
        self.worker = EmbeddedWorker(self.services, client, concurrency=self.worker_concurrency)
        self.worker.start()
        self.app = create_app(self.services, engine_ready=lambda: self.engine is not None)
        self.app.state.engine_stats = lambda: {client.engine_id: self.engine.stats()}  # /admin, /metrics
        return self

    def serve_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve HTTP on a daemon thread; ``port=0`` picks a free port. Returns the base URL."""
        import uvicorn

        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        host_shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{host_shown}:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.server_thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                              name="diarist-http", daemon=True)
        self.server_thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.server_thread.is_alive():
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.02)
        return self.url

    def serve_forever(self, sock: socket.socket, on_started: Callable[[], None] = lambda: None) -> None:
        """Serve HTTP on ``sock`` (bound, :func:`cli.listen.bind_listen`) in the foreground until Ctrl-C /
        SIGTERM, then return (the caller stops the stack and closes the socket). ``on_started()`` runs once
        the app serves (:class:`cli.serving.AnnouncingServer`); a failed app startup is uvicorn's
        ``SystemExit(3)``, after it logged why."""
        import uvicorn

        from cli.serving import AnnouncingServer, run_until_signal

        server = AnnouncingServer(uvicorn.Config(self.app, log_level="info", lifespan="on",
                                                 log_config=None), on_started)  # lines go through diarist.logs
        run_until_signal(server, sock)  # returns on SIGINT/SIGTERM, so the caller's stop() runs

    def stop(self) -> None:
        """Stop HTTP, the worker threads and (if this stack started it) the engine loop."""
        if self.server is not None:
            self.server.should_exit = True
            if self.server_thread is not None:
                self.server_thread.join(timeout=10)
        if self.worker is not None:
            self.worker.stop()
        if self._own_engine_loop and self.engine is not None:
            self.engine.shutdown()
        if self.services is not None:
            self.services.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
