"""A Celery worker configured by :func:`worker.celery_app.configure` (threads pool, acks_late), for
``test_redis_restart.py``: ``python -m tests.worker.redis_restart_child BROKER_URL OUT_DIR``.

Its one task sleeps ``seconds`` and then writes ``OUT_DIR/<name>``, so the test sees which jobs ran to the
end; the worker's exit code is written to ``OUT_DIR/exitcode`` when Celery stops it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from celery import Celery

from diarist.settings import Settings
from worker import routing
from worker.celery_app import configure

app = configure(Settings(broker_url=sys.argv[1], visibility_timeout_s=60), Celery("redis-restart"))
OUT = Path(sys.argv[2])


@app.task(name="test.sleep_then_mark")
def sleep_then_mark(name: str, seconds: float) -> None:
    (OUT / f"{name}.started").touch()
    time.sleep(seconds)
    (OUT / name).touch()


if __name__ == "__main__":
    w = app.Worker(pool="threads", concurrency=2, queues=[routing.SHORT], hostname="short@restart-test",
                   loglevel="INFO", without_mingle=True, without_gossip=True)
    w.start()
    (OUT / "exitcode").write_text(str(w.exitcode or 0))
