"""Run Celery workers inside this process, as threads (embedded mode and tests).

Celery's ``WorkController`` (the worker without the CLI's signal handlers, banner and stdout redirection;
the same class ``celery.contrib.testing`` uses) runs on a daemon thread with the ``threads`` pool, consuming
all three queues from the in-memory broker. One controller, because queue selection lives on the shared
app; the per-class concurrency split is a production (one process per class) feature.
"""

from __future__ import annotations

import logging
import threading
import time

from diarist.services import Services
from engine_server.client import EngineClient
from worker import routing
from worker.celery_app import CeleryDispatcher, app, configure
from worker.runtime import Runtime, set_runtime
from worker.sweeper import Sweeper

log = logging.getLogger("diarist")


class EmbeddedWorker:
    """Start/stop an in-process worker that serves ``services`` with ``engine``."""

    def __init__(self, services: Services, engine: EngineClient, concurrency: int | None = None) -> None:
        st = services.settings
        configure(st)
        self.dispatcher = CeleryDispatcher(st)
        services.dispatcher = self.dispatcher
        self.runtime = Runtime(services=services, engine=engine, dispatcher=self.dispatcher)
        set_runtime(self.runtime)
        self.sweeper = Sweeper(services, self.dispatcher, "embedded", list(routing.QUEUES), engine=engine,
                               leases=self.runtime.leases)
        self.concurrency = concurrency or sum(st.worker_threads(k) for k in routing.CLASSES)
        self.controller = None
        self.thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        import worker.tasks  # noqa: F401 - registers the tasks on the app

        self.controller = app.WorkController(
            pool_cls="threads", concurrency=self.concurrency, queues=list(routing.QUEUES),
            hostname="embedded@localhost", without_heartbeat=True, without_mingle=True, without_gossip=True,
            loglevel="WARNING")
        self.thread = threading.Thread(target=self.controller.start, name="diarist-celery", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._consuming():
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the embedded Celery worker did not start")
            time.sleep(0.02)
        # The in-memory broker starts empty: whatever the rows say is queued or running was accepted by a
        # previous run of this process (killed or stopped) and is sent again now.
        report = self.sweeper.sweep(force=True)
        if report.resent or report.webhooks_resent:
            log.warning("resumed %d job(s) and %d webhook(s) left by the previous run",
                                                 report.resent, report.webhooks_resent)
        self.runtime.leases.start()
        self.sweeper.start()

    def _consuming(self) -> bool:
        consumer = getattr(self.controller, "consumer", None)
        return bool(consumer is not None and getattr(consumer, "task_consumer", None) is not None)

    def stop(self) -> None:
        # The sweeper first (nothing new is sent), then the running jobs are handed back (queued again, their
        # engine work aborted: worker/stopping.py) and the worker stopped, then the renewals; queued jobs
        # are resumed by the next start.
        self.sweeper.stop()
        self.runtime.leases.hand_back_all()  # running jobs go back to the queue now (worker/stopping.py)
        if self.controller is not None:
            self.controller.stop(in_sighandler=False, exitcode=0)
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.runtime.leases.stop()
        set_runtime(None)
