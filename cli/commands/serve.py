"""``diarist serve [--embedded] [--host H] [--port P] [--workers N]``: run the HTTP API.

``--embedded``: the whole stack in this process (SQLite, local object store, in-memory Celery broker with
worker threads, the engine in-process); API keys are off unless ``DIARIST_AUTH=true``. Without it: the API
only, against the configured Postgres / Redis / S3 (run ``diarist migrate`` first, and workers with
``diarist worker``).
"""

from __future__ import annotations

import argparse
from typing import Any

from cli.commands import plain


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="run the HTTP API (--embedded: the whole stack in one process)",
                              description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--embedded", action="store_true", help="SQLite + local store + in-process worker and engine")
    p.add_argument("--host", default=None, help="listen address (default DIARIST_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (default DIARIST_PORT or 8000; 0: a free one, printed)")
    p.add_argument("--data-dir", default=None, help="embedded mode's data folder (default DIARIST_DATA_DIR or .diarist)")
    p.add_argument("--workers", type=int, default=None, help="API processes on the one port (default "
                   "DIARIST_API_WORKERS, 1); not with --embedded")
    p.add_argument("--device", default=None, help="embedded mode's engine device: cpu, cuda or cuda:N "
                   "(default DIARIST_DEVICE, cpu)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from api.admin.config import get_admin_settings
    from diarist.logs import configure_logging
    from diarist.settings import Settings

    st = Settings()
    get_admin_settings()  # here, before any process starts: uvicorn's --workers children build the app
    configure_logging(st.log_format, st.log_level)
    host = args.host or st.host
    port = args.port if args.port is not None else st.port  # 0 is a port (any free one), not "unset"
    from cli.listen import bind_listen, loopback_of, url_of
    from cli.options import BadOption

    if args.workers is not None and (args.workers < 1 or args.embedded or st.embedded):
        raise BadOption("bad_option", "--workers takes a count >= 1 and runs the API only (not with --embedded, "
                                      "whose one process holds the engine)")  # the CLI's one line, exit 2

    if args.embedded or st.embedded:
        from cli.commands.stack import EmbeddedStack, embedded_settings
        from engine.resolve import check_device

        overrides = {k: v for k, v in (("data_dir", args.data_dir), ("device", args.device)) if v}
        est = embedded_settings(st, **overrides)
        check_device(est.device)  # as `diarist engine`: a missing device first, then the port
        # a port in use: one line and exit 2 before the stack starts (cli.listen); --port 0: the OS picks it
        sock = bind_listen(host, port)
        try:
            stack = EmbeddedStack(est).start()
            url = url_of(host, sock)
            try:
                stack.serve_forever(sock, on_started=lambda: print(
                    f"Diarist (embedded) listening on {url}  (API docs: {url}/docs)", flush=True))
            finally:
                stack.stop()
        finally:
            sock.close()
        return 0

    import uvicorn

    from api.routes.health import LIVENESS_PATH
    from cli.serving import AnnouncingServer, announce_when_answering, run_until_signal

    sock = bind_listen(host, port)  # before uvicorn builds the app and its connections; --port 0: the OS picks
    workers = args.workers or st.api_workers
    url = url_of(host, sock)
    # printed once the app serves; a failed startup never prints it (uvicorn logs why and exits 3)
    line = f"Diarist API listening on {url}"
    if workers > 1:  # each process builds its own services from the same settings (the factory below)
        # uvicorn's supervisor binds the port itself for its children (it takes no socket): hand it the number;
        # the app starts in the children, so the line waits for the first one to answer its liveness route
        port = sock.getsockname()[1]
        sock.close()
        announce_when_answering(f"http://{loopback_of(host)}:{port}{LIVENESS_PATH}", line)
        uvicorn.run("cli.commands.serve:create_api", factory=True, workers=workers, host=host, port=port,
                    log_level=st.log_level.lower(), lifespan="on", log_config=None)
        return 0
    try:  # our handler (diarist.logs) formats uvicorn's lines too
        server = AnnouncingServer(uvicorn.Config(create_api(), log_level=st.log_level.lower(), lifespan="on",
                                                 log_config=None), on_started=lambda: print(line, flush=True))
        run_until_signal(server, sock)
    finally:
        sock.close()
    return 0


def create_api() -> Any:
    """The API app on the configured Postgres / Redis / S3 (``Settings()``), for one uvicorn process."""
    from api.app import create_app
    from diarist.logs import configure_logging
    from diarist.services import Services
    from diarist.settings import Settings
    from engine_server.client import HttpEngineClient
    from worker.celery_app import CeleryDispatcher, configure

    st = Settings()
    configure_logging(st.log_format, st.log_level)
    services = Services.from_settings(st)
    services.dispatcher = CeleryDispatcher(st, configure(st))
    # enrollment samples are embedded by the host's engine server (POST /internal/embed): no model here
    services.voices = HttpEngineClient(st.engine_url[0], expected_family=st.model)
    return create_app(services)
