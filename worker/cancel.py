"""How a running job learns it was canceled: a :class:`CancelToken` and the :class:`CancelWatch` that sets it.

The job row is the source of truth (a cancel is ``processing → canceled`` by the API or the dashboard), so
the watch polls the row's status on its own thread while the engine works: a cancel is seen within
``Settings.cancel_poll_s`` whatever the engine is doing (prefill, a batch of windows that all finish at
the end, diarization), not only when the next progress event happens to arrive. The token's callbacks
then stop the engine work (the HTTP client shuts its stream's socket, which the engine server takes as
the abort of the request's sequences).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Self

from sqlalchemy import select

from diarist.models import Job, JobStatus
from diarist.services import Services

log = logging.getLogger("diarist.worker")


class CancelToken:
    """A one-way switch with callbacks: :meth:`cancel` sets it once and runs every registered callback.

    Thread-safe. A callback added after the switch is set runs at once (in the adding thread), so there
    is no window in which a cancel can be missed.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        """True once :meth:`cancel` was called (usable as a ``should_cancel`` callable)."""
        return self._event.is_set()

    def cancel(self) -> None:
        """Set the switch and run the callbacks (once; later calls do nothing)."""
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            _run(fn)

    def add_callback(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Run ``fn`` on cancel (at once when already canceled). Returns a function that unregisters it."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return lambda: self._remove(fn)
        _run(fn)
        return lambda: None

    def _remove(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if fn in self._callbacks:
                self._callbacks.remove(fn)


def _run(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # one failing callback must not keep the others from stopping their work
        log.exception("cancel callback failed")


class CancelWatch:
    """While open, polls the job row every ``interval_s`` seconds and cancels ``token`` once the job is no
    longer ``processing`` (canceled, deleted, or finished by another attempt) or, with ``owner``, once its
    lease belongs to another attempt (this one looked dead and was taken over).

    A database error is logged and polled again: an outage is not a cancel. Use as a context manager.
    """

    def __init__(self, svc: Services, job_id: str, token: CancelToken, interval_s: float,
                 owner: str | None = None) -> None:
        self.svc, self.job_id, self.token, self.interval_s = svc, job_id, token, interval_s
        self.owner = owner
        self._stop = threading.Event()
        ctx = contextvars.copy_context()  # the job's log context (diarist.logs.job_context) follows the thread
        self._thread = threading.Thread(target=ctx.run, args=(self._run,), name=f"cancel-watch-{job_id}",
                                        daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=max(1.0, 2 * self.interval_s))

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.interval_s):
            try:
                with self.svc.db.session() as s:
                    row = s.execute(select(Job.status, Job.lease_owner).where(Job.id == self.job_id)).first()
            except Exception as e:  # noqa: BLE001 - the next poll tries again
                if not failing:  # once per outage, not twice a second
                    log.warning("cancel watch cannot read the job row (retrying): %s", e)
                failing = True
                continue
            failing = False
            status, owner = row if row is not None else (None, None)
            if status != JobStatus.PROCESSING.value:
                log.info("job left processing (%s): stopping its engine work", status or "deleted")
                self.token.cancel()
                return
            if self.owner is not None and owner != self.owner:
                log.info("job's lease went to another attempt: stopping this one's engine work")
                self.token.cancel()
                return
