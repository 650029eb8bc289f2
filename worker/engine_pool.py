"""A transcription worker's engine servers: its own engine first, the host's other engines while it is down.

Scale-out (docs/operations.md, "Several GPUs, several hosts"): one engine server per GPU, and per engine one
worker set (a ``short`` and a ``long`` worker) whose ``DIARIST_ENGINE_URL`` names that engine first. Celery
spreads the jobs: every worker set consumes the same queues, a worker takes a message only when one of its
threads is free, and its threads are sized to its own engine's rows (``threads_to_fill``), so jobs flow to
the engines with spare rows without a router or a load picture. This module only handles the engine being
gone: the rest of the list are the host's other engines, tried in turn when the worker's own does not answer.

What counts as "does not answer" is the client's outage (:class:`engine_server.client.JobFailure` with
``outage``: connection refused, 502/503/504), raised before the engine ran anything of the job, so sending
the same attempt to the next engine is safe and spends nothing (its client decodes the audio again:
:class:`HttpEngineClient` decodes before it connects; the hold below keeps that to the first jobs after an
engine dies). A request the engine dropped after it started (the engine died mid-job) is *not* failed over
here: it ends the attempt as ``engine_error`` and the job service's rules apply (an attempt is spent, the
retry is sent to the queue; worker/process.py), so a job that crashes engines cannot take down every engine
of the host in one attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from diarist.contract.options import TranscribeOptions
from diarist.contract.result import TranscriptionResult
from engine_server.client import EngineClient, EventFn, HttpEngineClient, JobFailure
from worker.cancel import CancelToken

log = logging.getLogger("diarist.worker")

DOWN_HOLD_S = 5.0
"""After an engine did not answer, it is tried last for this long (seconds): a dead engine on loopback
refuses in microseconds, but one behind a network or a proxy can take a connect timeout per job."""


class EnginePool:
    """Several engine clients behind the :class:`engine_server.client.EngineClient` interface.

    ``clients[0]`` is the worker's own engine and gets every job while it answers. When it does not (an
    outage), the job goes to the first of the others that answers, those with the fewest requests in
    flight from this process first (ties: list order), so the jobs of a dead engine's workers spread over
    the live ones. An engine that did not answer is tried last for ``down_hold_s`` seconds, or until it
    serves a job. When no engine answers, the last outage is raised:
    the job waits it out without spending an attempt (:mod:`diarist.outages`).

    Raises ValueError on an empty ``clients``.
    """

    def __init__(self, clients: Sequence[EngineClient], down_hold_s: float = DOWN_HOLD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not clients:
            raise ValueError("EnginePool needs at least one engine client")
        self.clients = list(clients)
        self.down_hold_s, self._clock = down_hold_s, clock
        self._lock = threading.Lock()
        self._in_flight = [0] * len(self.clients)
        self._down_until = [float("-inf")] * len(self.clients)

    @property
    def engine_id(self) -> str:
        """The worker's own engine (an engine server names itself in each result it sends)."""
        return self.clients[0].engine_id

    @property
    def url(self) -> str | None:
        """The worker's own engine's URL (the dashboard's worker row shows it)."""
        return getattr(self.clients[0], "url", None)

    def order(self) -> list[int]:
        """Indices of ``clients`` in the order the next job tries them (see the class doc)."""
        now = self._clock()
        with self._lock:
            up = [i for i in range(len(self.clients)) if self._down_until[i] <= now]
            down = [i for i in range(len(self.clients)) if self._down_until[i] > now]
            home = [i for i in up if i == 0]
            others = sorted((i for i in up if i != 0), key=lambda i: (self._in_flight[i], i))
        return home + others + down

    def in_flight(self) -> list[int]:
        """Requests this process has in flight on each engine, in ``clients`` order."""
        with self._lock:
            return list(self._in_flight)

    def transcribe(self, audio: Path, options: TranscribeOptions, on_event: EventFn | None = None,
                   cancel: CancelToken | None = None) -> TranscriptionResult:
        """The first answering engine's :meth:`EngineClient.transcribe` (same arguments, result and errors).

        Raises:
            JobFailure: the serving engine's failure (``canceled``, ``engine_error``, the job's own codes), or
                the last engine's outage (``engine_unavailable``) when none answered.
        """
        last: JobFailure | None = None
        for i in self.order():
            client = self.clients[i]
            with self._lock:
                self._in_flight[i] += 1
            try:
                result = client.transcribe(audio, options, on_event=on_event, cancel=cancel)
            except JobFailure as e:
                if e.outage is None:
                    # The job's own failure (bad audio, found before any engine call; canceled) or a dropped
                    # request: nothing sure about the engine, so a refusal's mark stays until its hold ends.
                    raise
                self._mark(i, up=False)
                last = e
                log.warning("engine %s unavailable (%s); trying the next engine", client.engine_id, e.message)
                continue
            finally:
                with self._lock:
                    self._in_flight[i] -= 1
            self._mark(i, up=True)
            return result  # the serving engine names itself in it (engine_id), so the job row records it
        assert last is not None  # order() lists every client, so at least one was tried
        raise last

    def ready(self) -> bool:
        """Whether some engine answers its health check (this worker can serve jobs)."""
        return any(c.ready() for c in self.clients)

    def _mark(self, i: int, up: bool) -> None:
        with self._lock:
            self._down_until[i] = float("-inf") if up else self._clock() + self.down_hold_s


def engine_client(urls: Sequence[str], timeout_s: float, expected_family: str | None = None) -> EngineClient:
    """The client a transcription worker uses for the engine servers ``urls`` (its own first): one
    :class:`HttpEngineClient` for one URL, an :class:`EnginePool` of them for several. ``timeout_s`` is the
    longest one engine request may take (``DIARIST_ENGINE_TIMEOUT_S``). Each engine says which model family it
    serves and how to decode for it (``GET /info``); ``expected_family`` (``DIARIST_MODEL``) only draws a
    warning when one serves another.

    Raises ValueError on no URL.
    """
    clients = [HttpEngineClient(u, timeout_s=timeout_s, expected_family=expected_family) for u in urls]
    if not clients:
        raise ValueError("no engine URL given")
    return clients[0] if len(clients) == 1 else EnginePool(clients)
