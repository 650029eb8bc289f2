"""The leases this worker process holds on running jobs, renewed by one heartbeat thread.

Each attempt gets a unique owner token (``host:pid:random``) written into the job row by the claim
(:func:`diarist.jobs.claim`). Every ``lease_s / 4`` seconds the keeper extends the lease of each held job;
a renewal that finds the lease gone (the job was canceled, or the sweeper handed it to another worker
after this one looked dead) marks the attempt ``lost``, and the attempt stops at its next engine event.
A database outage only skips renewals: a lease has four renewals of slack, and the sweeper waits one
``lease_s`` after the database returns before judging leases (worker/sweeper.py).

When the process is asked to stop (SIGTERM), :meth:`LeaseKeeper.hand_back_all` marks every held lease
``handed_back`` and stops its engine work; each attempt then gives its job back to the queue
(:mod:`worker.process`), and no new job is claimed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from diarist import jobs
from diarist.outages import classify
from diarist.services import Services

log = logging.getLogger("diarist.worker")


@dataclass
class Lease:
    """One attempt's hold on a job row; ``lost`` once the row says another owner (or a final state);
    ``handed_back`` once the process stops and gives the job back; ``stop`` ends the attempt's engine work
    (set by the attempt once it has some)."""

    job_id: str
    owner: str
    lost: bool = False
    handed_back: bool = False
    stop: Callable[[], None] | None = None


class LeaseKeeper:
    """Owner tokens, the set of held leases, and the renewal thread (started by the worker process)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.process = f"{socket.gethostname()}:{os.getpid()}"
        self._held: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.closing = False  # set by hand_back_all: no new claim

    def new_owner(self) -> str:
        """A token naming one attempt (unique across processes and attempts)."""
        return f"{self.process}:{uuid.uuid4().hex[:12]}"

    def hold(self, job_id: str, owner: str) -> Lease:
        lease = Lease(job_id, owner)
        with self._lock:
            self._held[job_id] = lease
        return lease

    def release(self, lease: Lease) -> None:
        with self._lock:
            if self._held.get(lease.job_id) is lease:
                del self._held[lease.job_id]

    def held(self) -> list[Lease]:
        with self._lock:
            return list(self._held.values())

    def hand_back_all(self) -> int:
        """The process is stopping: claim nothing more, and end every held attempt's engine work so that it
        gives its job back (thread-safe; quick: safe in a signal handler). Returns how many were held."""
        self.closing = True
        held = self.held()
        for lease in held:
            lease.handed_back = True
            if lease.stop is not None:
                try:
                    lease.stop()
                except Exception:  # one failing stop must not keep the others running
                    log.exception("stopping the engine work of %s failed", lease.job_id)
        return len(held)

    def renew_all(self) -> int:
        """Renew every held lease once; returns how many were renewed. Never raises for an outage."""
        n = 0
        for lease in self.held():
            try:
                if jobs.renew_lease(self.services, lease.job_id, lease.owner):
                    n += 1
                else:
                    lease.lost = True
            except Exception as e:
                if classify(e) is None:
                    raise
                log.warning("lease renewal of %s skipped: %s unavailable", lease.job_id, classify(e).value)
        return n

    def start(self) -> None:
        interval = self.services.settings.lease_s / 4

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.renew_all()
                except Exception:  # a bug here must not end the heartbeat of every job
                    log.exception("lease renewal failed")

        self._thread = threading.Thread(target=loop, name="diarist-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
