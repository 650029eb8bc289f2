"""``diarist worker --class short|long|webhooks [--concurrency N]``: one Celery worker process per class.

Thread pool; consumes only its class's queue (``transcribe.short``, ``transcribe.long`` or ``webhooks``).
Transcription workers stream from the engine server at DIARIST_ENGINE_URL (the first of its list; the
others take the jobs while it is down) and never load a model (no CUDA in workers). Each process also
renews the leases of the jobs it runs and runs a sweeper (worker/sweeper.py) that re-drives jobs and
webhooks left by dead workers or a lost broker message. SIGTERM: the worker takes no more jobs and hands
its running ones back for re-drive, then exits (worker/stopping.py).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from cli.commands import plain


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("worker", help="run a Celery worker for one duration class", description=plain(__doc__))
    p.add_argument("--class", dest="klass", required=True, choices=("short", "long", "webhooks"))
    p.add_argument("--concurrency", type=int, default=None, help="threads (default: the class's setting)")
    p.add_argument("--engine-url", default=None, type=_engine_urls,
                   help="engine server(s): a URL, or URLs separated by commas, this worker's own engine first and "
                   "the host's other engines after it for failover (default DIARIST_ENGINE_URL)")
    p.add_argument("--loglevel", default=None, help="log level (default DIARIST_LOG_LEVEL)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve this worker's Prometheus metrics on this port (default DIARIST_WORKER_METRICS_PORT)")
    p.set_defaults(func=run)
    return p


def _engine_urls(text: str) -> list[str]:
    from diarist.urls import parse_engine_urls

    try:
        return parse_engine_urls(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    import socket

    from celery.signals import setup_logging

    from diarist.logs import configure_logging
    from diarist.scratch import Scratch
    from diarist.services import Services
    from diarist.settings import Settings
    from worker import routing
    from worker.celery_app import CeleryDispatcher, app, configure
    from worker.engine_pool import engine_client
    from worker.runtime import Runtime, set_runtime

    st = Settings()
    level = args.loglevel or st.log_level
    configure_logging(st.log_format, level)
    # A receiver on setup_logging makes Celery leave logging alone: its lines go through our handler.
    setup_logging.connect(lambda **_kw: configure_logging(st.log_format, level), weak=False)
    configure(st)
    # Downloads go under this process's scratch directory; a killed worker's are removed here (diarist.scratch).
    scratch = Scratch.create(f"worker-{args.klass}", st.scratch_dir)
    for path in scratch.removed:
        logging.getLogger(__name__).info("removed the scratch directory of a dead process: %s", path)
    services = Services.from_settings(st, scratch_dir=scratch.path)
    dispatcher = CeleryDispatcher(st)
    services.dispatcher = dispatcher
    engine = None
    if args.klass != "webhooks":
        # each engine says which family it serves and how to decode for it; DIARIST_MODEL only checks that
        engine = engine_client(args.engine_url or st.engine_url, timeout_s=st.engine_timeout_s,
                               expected_family=st.model)
    from worker.sweeper import Sweeper

    rt = Runtime(services=services, engine=engine, dispatcher=dispatcher)
    set_runtime(rt)
    hostname = f"{args.klass}@{socket.gethostname()}"
    concurrency = args.concurrency or st.worker_threads(args.klass)
    import worker.tasks  # noqa: F401 - registers the tasks

    metrics_port = args.metrics_port if args.metrics_port is not None else st.worker_metrics_port
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=st.worker_metrics_host, registry=services.metrics.registry)

    # Leases of the jobs this process runs, and the sweeper that re-drives other processes' dead ones.
    rt.leases.start()
    sweeper = Sweeper(services, dispatcher, hostname, [routing.CLASSES[args.klass]], engine=engine, leases=rt.leases)
    sweeper.start()
    # quiet: no banner printed to stdout, which would break a JSON log stream ("<hostname> ready." is logged)
    from worker.stopping import handing_back_worker

    # SIGTERM hands the running jobs back instead of waiting for them (worker/stopping.py)
    w = handing_back_worker(app, rt.leases)(
        pool="threads", concurrency=concurrency, queues=[routing.CLASSES[args.klass]], hostname=hostname,
        loglevel=level, without_mingle=True, without_gossip=True, quiet=st.log_format == "json")
    try:
        w.start()
    finally:
        sweeper.stop()
        rt.leases.stop()
        scratch.close()
    # Celery ends the worker with a failure exit code after an unrecoverable error (a broker restart under
    # a running job no longer is one: worker/redis_broker.py); passing it on lets the supervisor (compose's
    # restart policy, systemd Restart=on-failure) start the worker again, whose sweeper then re-drives what
    # it held.
    return int(w.exitcode or 0)
