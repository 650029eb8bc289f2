"""Running a uvicorn server so that SIGINT / SIGTERM end it the way the caller's cleanup expects, and saying
"listening" only once it serves.

uvicorn's own handlers re-raise the signal once the server has stopped, which kills the process before the
caller's ``finally`` runs (the engine loop is not shut down, the scratch directory of spooled uploads stays
until the next start). :func:`run_until_signal` installs handlers that only ask the server to exit, so
``run`` returns normally and the caller cleans up.

A "listening on" line is a promise a script waits for: :class:`AnnouncingServer` makes it after the
application's startup (lifespan) has finished and the socket listens, and never when startup fails;
:func:`announce_when_answering` makes it for uvicorn's ``--workers`` supervisor, whose children start the app.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn


class AnnouncingServer(uvicorn.Server):
    """A ``uvicorn.Server`` that calls ``on_started()`` once it serves: after ``startup`` has run the app's
    lifespan startup and listens on its sockets. A failed startup never calls it (uvicorn logs it and raises
    ``SystemExit(3)`` from ``startup``). ``on_started`` runs on the server's event loop: keep it short."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            self.on_started()


def announce_when_answering(url: str, line: str, interval_s: float = 0.2) -> threading.Thread:
    """Print ``line`` once ``GET url`` gets any HTTP answer (a liveness route of the app), from a daemon
    thread that polls every ``interval_s`` seconds until then; returns the thread (started).

    For a server whose app starts in other processes (uvicorn's ``--workers`` supervisor): its socket
    listens before any child has started the app, so only an answer says it serves. A status of 4xx/5xx is
    an answer too; a refused, reset or timed-out connection is not yet one. The thread ends with the process
    if no answer ever comes (a failed startup)."""

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # our own port: never via a proxy

    def poll() -> None:
        while True:
            try:
                with opener.open(url, timeout=max(interval_s, 1.0)):
                    break
            except urllib.error.HTTPError:
                break
            except OSError:  # URLError, ConnectionError, TimeoutError: nothing serves yet
                time.sleep(interval_s)
        print(line, flush=True)

    thread = threading.Thread(target=poll, name="announce-listening", daemon=True)
    thread.start()
    return thread


def run_until_signal(server: Any, sock: socket.socket | None = None) -> None:
    """Run ``server`` (a ``uvicorn.Server``, e.g. :class:`AnnouncingServer`) in this thread until SIGINT or
    SIGTERM, then return (the previous handlers are restored). ``sock``: a bound socket to serve on
    (:func:`cli.listen.bind_listen`) instead of the config's host and port. Must be called on the main thread
    (Python delivers signals there)."""

    @contextlib.contextmanager
    def on_signals() -> Iterator[None]:
        def handler(_sig: int, _frame: object) -> None:
            server.should_exit = True

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    server.capture_signals = on_signals
    server.run(sockets=None if sock is None else [sock])
