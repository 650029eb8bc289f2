"""How a worker reaches the engine: in-process (embedded mode) or the engine server over loopback HTTP.

Both clients take a local audio path and job options, call ``on_event(kind, payload)`` with the engine's
streaming events (``started``, ``delta`` {text}, ``segment`` {start, end, text}, ``finished``) and return the
engine result dict (see ``transcription.transcriber.Transcriber.transcribe``). ``admission_class`` (``short``,
``long`` or ``default``; :func:`worker.routing.admission_class`) is set on every engine sequence of the job, so
the engine admits the job against its class's own limit. Failures become :class:`JobFailure` with a machine
code; ``retryable`` says whether another attempt could succeed.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

EventFn = Callable[[str, dict], None]

OPTION_FIELDS = ("language", "prompt", "num_speakers", "min_speakers", "max_speakers", "multichannel")


class JobFailure(Exception):
    """A transcription that failed with a machine ``code`` (``decode_failed``, ``too_long``, ``engine_error``…)."""

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.retryable = code, message, retryable


class EngineClient(Protocol):
    engine_id: str

    def transcribe(self, audio: Path, options: dict, on_event: EventFn | None = None,
                   admission_class: str = "default") -> dict:
        """Raises JobFailure."""

    def ready(self) -> bool: ...


class InProcessEngineClient:
    """Calls a :class:`transcription.transcriber.Transcriber` in this process (embedded mode, tests)."""

    def __init__(self, transcriber: Any) -> None:
        self.transcriber = transcriber
        self.engine_id = f"inprocess:{socket.gethostname()}:{os.getpid()}"

    def transcribe(self, audio: Path, options: dict, on_event: EventFn | None = None,
                   admission_class: str = "default") -> dict:
        from transcription.audio import AudioError
        from engine.request import RequestRejected
        from transcription.transcriber import EngineError, TranscribeOptions

        opts = TranscribeOptions(**{k: options[k] for k in OPTION_FIELDS if options.get(k) is not None},
                                 admission_class=admission_class)
        try:
            # The worker's progress callback learns of a cancel from the job row; aborting frees the KV now
            # instead of finishing work nobody will read.
            return self.transcriber.transcribe(str(audio), opts, on_event=on_event,
                                               should_cancel=lambda: bool(getattr(on_event, "canceled", False)))
        except (AudioError, RequestRejected) as e:
            raise JobFailure(e.code, e.message) from e
        except EngineError as e:
            raise JobFailure("engine_error", str(e), retryable=True) from e

    def ready(self) -> bool:
        return True


class HttpEngineClient:
    """Streams ``POST /internal/transcribe`` of a ``diarist engine`` server (newline-delimited JSON events).

    The last line is ``{"type": "result", "result": {...}}`` or ``{"type": "error", "code", "message"}``.
    A dropped connection or a 5xx is retryable (``engine_error``); the server's own codes are not.
    Once ``on_event.canceled`` is true (the worker's progress callback saw the job canceled) the stream is
    closed at once, which makes the server abort the request's engine sequences, and :class:`JobFailure`
    ``canceled`` (not retryable) is raised.
    """

    def __init__(self, url: str, timeout_s: float = 7200.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.engine_id = self.url

    def transcribe(self, audio: Path, options: dict, on_event: EventFn | None = None,
                   admission_class: str = "default") -> dict:
        import httpx

        params = {k: options[k] for k in OPTION_FIELDS if options.get(k) is not None}
        query = {"options": json.dumps(params), "admission_class": admission_class}
        timeout = httpx.Timeout(self.timeout_s, connect=10.0)
        try:
            with open(audio, "rb") as f, httpx.Client(timeout=timeout) as client, client.stream(
                    "POST", f"{self.url}/internal/transcribe", params=query, content=f,
                    headers={"content-type": "application/octet-stream"}) as r:
                if r.status_code >= 400:
                    r.read()
                    raise _http_failure(r)
                for line in r.iter_lines():
                    if not line.strip():
                        continue
                    msg = json.loads(line)
                    kind = msg.pop("type")
                    if kind == "result":
                        return msg["result"]
                    if kind == "error":
                        raise JobFailure(msg["code"], msg["message"], retryable=msg["code"] == "engine_error")
                    if on_event is not None:
                        on_event(kind, msg)
                        if getattr(on_event, "canceled", False):
                            # Leaving the block closes the connection mid-stream: the server's cue to abort.
                            raise JobFailure("canceled", "the job was canceled; engine request closed")
        except httpx.HTTPError as e:
            raise JobFailure("engine_error", f"engine server unreachable or dropped: {e}", retryable=True) from e
        raise JobFailure("engine_error", "engine stream ended without a result", retryable=True)

    def ready(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False


def _http_failure(r) -> JobFailure:
    try:
        err = r.json()["error"]
        return JobFailure(err["code"], err["message"], retryable=r.status_code >= 500)
    except (ValueError, KeyError, TypeError):
        return JobFailure("engine_error", f"engine server answered {r.status_code}", retryable=True)
