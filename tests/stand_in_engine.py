"""A loopback HTTP server standing in for the engine server: it answers every POST with NDJSON lines, and
``GET /info`` as a Whisper engine does (:data:`INFO`).

Tests of the worker's side of the wire (``engine_server.client``, the engine pool, cancellation) use it
where a real engine server would only add minutes of model work.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from tests.servers import QuietHandler, serve_http

INFO = {"engine_id": "stand-in", "family": "whisper", "frontend": "ffmpeg", "model": "stand-in",
        "random_weights": False}
"""The stand-in's ``GET /info`` (``engine_server.server.engine_info``): a Whisper engine."""


@contextlib.contextmanager
def stand_in_engine(lines: Callable[[], list[Any]]) -> Iterator[tuple[str, list[dict]]]:
    """Serve on 127.0.0.1 (a free port) until the block exits.

    ``lines()`` is called for each request and gives the response lines: a ``str`` is sent as it is, anything
    else as ``json.dumps``; each line ends with a newline. Yields ``(base_url, seen)``, where ``seen`` gets
    ``{"path", "headers"}`` (header names lowercased) for each request, after its body has been read.
    """
    seen: list[dict] = []

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
            body = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines()).encode()
            self.reply(200, body, "application/x-ndjson")

        def do_GET(self) -> None:
            if self.path == "/info":
                self.reply(200, json.dumps(INFO).encode(), "application/json")
            else:
                self.reply(404)

    with serve_http(Handler) as url:
        yield url, seen
