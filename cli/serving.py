"""Running a uvicorn server so that SIGINT / SIGTERM end it the way the caller's cleanup expects.

uvicorn's own handlers re-raise the signal once the server has stopped, which kills the process before the
caller's ``finally`` runs (the engine loop is not shut down, the scratch directory of spooled uploads stays
until the next start). :func:`run_until_signal` installs handlers that only ask the server to exit, so
``run`` returns normally and the caller cleans up.
"""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator
from typing import Any


def run_until_signal(server: Any, sock: socket.socket | None = None) -> None:
    """Run ``server`` (a ``uvicorn.Server``) in this thread until SIGINT or SIGTERM, then return (the previous
    handlers are restored). ``sock``: a bound socket to serve on (:func:`cli.listen.bind_listen`) instead of
    the config's host and port. Must be called on the main thread (Python delivers signals there)."""

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
