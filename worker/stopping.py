"""How a ``diarist worker`` process stops on SIGTERM: it takes no more jobs and hands its running ones back.

Celery's own SIGTERM is a warm shutdown: stop consuming, then wait for every running task to end, which for
a transcription worker meant waiting for every job in flight (113 s with 13 running, issue 33). Here
SIGTERM instead:

1. stops consuming (Celery's warm shutdown flag, as before);
2. calls :meth:`worker.leases.LeaseKeeper.hand_back_all`: every running attempt's engine work is aborted
   (the engine server frees its sequences), its job goes back to ``queued`` without spending an attempt
   and its message is sent again (:func:`worker.process._hand_back`), so another worker takes it at once;
3. exits once those tasks have returned.

The bound (docs/service.md, "Fault tolerance"): a running job is handed back within the time its attempt
takes to notice (at once while it waits on the engine; after its audio fetch or decode when it is in one)
plus one database write and one broker publish. A job that cannot be handed back (the database is down)
keeps its lease until it lapses and the sweeper re-drives it, within ``lease_s + sweep_interval_s``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from worker.leases import LeaseKeeper

log = logging.getLogger("diarist.worker")


def handing_back_worker(app: Any, leases: LeaseKeeper) -> type:
    """``app.Worker`` whose SIGTERM hands the running jobs back (module docstring) instead of waiting for
    them; other signals keep Celery's handlers (SIGINT twice, SIGQUIT: cold shutdown)."""
    from celery import platforms
    from celery.platforms import EX_OK
    from celery.worker import state

    def on_sigterm(*_args: Any) -> None:
        # Signal-handler context: set the flag Celery's handler sets, and leave the rest (locks, logging,
        # sockets) to a thread.
        state.should_stop = EX_OK
        threading.Thread(target=_hand_back, args=(leases,), name="diarist-hand-back", daemon=True).start()

    class Worker(app.Worker):
        def install_platform_tweaks(self, worker: Any) -> None:
            super().install_platform_tweaks(worker)
            platforms.signals["SIGTERM"] = on_sigterm

    return Worker


def _hand_back(leases: LeaseKeeper) -> None:
    n = leases.hand_back_all()
    log.info("SIGTERM: taking no more jobs; handing %d running job(s) back for re-drive, then exiting", n)
