"""How a worker reaches the engine: in-process (embedded mode) or the engine server over loopback HTTP.

Both clients take a local audio path and job options, call ``on_event(kind, payload)`` with the engine's
streaming events (``started``, ``delta`` {text}, ``segment`` {start, end, text}, ``finished``) and return the
engine result dict (see ``transcription.transcriber.Transcriber.transcribe``). Failures become :class:`JobFailure`
with a machine code; ``retryable`` says whether another attempt could succeed. A ``cancel`` token
(:class:`worker.cancel.CancelToken`) stops the engine work as soon as it is set: the call then raises
:class:`JobFailure` ``canceled`` (not retryable). ``admission_class`` (``short``, ``long`` or
``default``; :func:`worker.routing.admission_class`) is set on every engine sequence of the job, so the
engine admits the job against its class's own limit.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from diarist.logs import current_job_id
from diarist.outages import Dependency
from engine_server.protocol import (
    ADMISSION_CLASS_HEADER,
    JOB_ID_HEADER,
    OPTION_FIELDS,
    OPTIONS_HEADER,
    PCM_HEADER,
)
from worker.cancel import CancelToken

EventFn = Callable[[str, dict], None]


class JobFailure(Exception):
    """A transcription that failed with a machine ``code`` (``decode_failed``, ``too_long``, ``engine_error``…).

    ``retryable``: another attempt could succeed (it spends one of the job's attempts). ``outage``: the
    engine server did not answer at all (refused connection, 502/503/504), so the job waits it out without
    spending an attempt (see :mod:`diarist.outages`).
    """

    def __init__(self, code: str, message: str, retryable: bool = False, outage: Dependency | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.retryable, self.outage = code, message, retryable or outage is not None, outage


class EngineClient(Protocol):
    engine_id: str

    def transcribe(self, audio: Path, options: dict, on_event: EventFn | None = None,
                   cancel: CancelToken | None = None, admission_class: str = "default") -> dict:
        """Raises JobFailure (``canceled`` once ``cancel`` is set)."""

    def ready(self) -> bool: ...


class InProcessEngineClient:
    """Calls a :class:`transcription.transcriber.Transcriber` in this process (embedded mode, tests)."""

    def __init__(self, transcriber: Any) -> None:
        self.transcriber = transcriber
        self.engine_id = f"inprocess:{socket.gethostname()}:{os.getpid()}"

    def transcribe(self, audio: Path, options: dict, on_event: EventFn | None = None,
                   cancel: CancelToken | None = None, admission_class: str = "default") -> dict:
        from engine.request import RequestRejected
        from transcription.audio import AudioError
        from transcription.transcriber import EngineError, TranscribeOptions

        opts = TranscribeOptions(**{k: options[k] for k in OPTION_FIELDS if options.get(k) is not None},
                                 admission_class=admission_class)
        try:
            # The transcriber polls the token between stages and the engine while it decodes: aborting
            # frees the KV now instead of finishing work nobody will read.
            result = self.transcriber.transcribe(str(audio), opts, on_event=on_event,
                                                 should_cancel=cancel.is_set if cancel is not None else None)
        except (AudioError, RequestRejected) as e:
            raise JobFailure(e.code, e.message) from e
        except EngineError as e:
            raise JobFailure("engine_error", str(e), retryable=True) from e
        if cancel is not None and cancel.is_set():
            raise JobFailure("canceled", "the job was canceled; engine work aborted")
        return result

    def ready(self) -> bool:
        return True


class HttpEngineClient:
    """Streams ``POST /internal/transcribe`` of a ``diarist engine`` server (newline-delimited JSON events).

    The audio is decoded here (PyAV, 16 kHz float32) and sent as samples (:class:`engine_server.protocol.PcmFormat`):
    the engine process, whose loop thread drives the GPU, then spends no CPU on FFmpeg
    (``benchmarks/results/service_gpu_h200.md``). Undecodable audio fails here with the decoder's code, before
    any engine call; the result's ``metrics.worker_decode_s`` is the decode time (seconds).

    The last line is ``{"type": "result", "result": {...}}`` or ``{"type": "error", "code", "message"}``.
    A dropped connection or a 5xx is retryable (``engine_error``); the server's own codes are not.
    Once ``cancel`` is set the stream's socket is shut down from the cancelling thread, even while this
    one is blocked reading a stream with nothing to say (prefill, windows that all end at once): the
    server sees the disconnect and aborts the request's engine sequences (``engine_server.server``: closing
    the stream is the cancel signal, so a dead worker and a canceled job take the same path).
    """

    def __init__(self, url: str, timeout_s: float = 7200.0, family: str = "whisper") -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.engine_id = self.url
        self.family = family  # the engine's model family: the audio is decoded as its official loader does

    def transcribe(self, audio: Path, options: dict, on_event: EventFn | None = None,
                   cancel: CancelToken | None = None, admission_class: str = "default") -> dict:
        import httpx

        from transcription.audio.decode import AudioError, Frontend, decode_audio

        params = {k: options[k] for k in OPTION_FIELDS if options.get(k) is not None}
        if cancel is not None and cancel.is_set():
            raise JobFailure("canceled", "the job was canceled; engine request closed")
        t0 = time.perf_counter()
        try:  # decoded here, on the worker's CPU: the engine process keeps its CPU for the GPU loop
            decoded = decode_audio(audio, mono=not options.get("multichannel"),
                                   frontend=Frontend.for_family(self.family))
        except AudioError as e:
            raise JobFailure(e.code, e.message) from e
        decode_s = time.perf_counter() - t0
        pcm = decoded.pcm_format()
        headers = {"content-type": "application/octet-stream", PCM_HEADER: pcm.to_header(),
                   OPTIONS_HEADER: json.dumps(params, ensure_ascii=True), ADMISSION_CLASS_HEADER: admission_class}
        if (job_id := current_job_id()) is not None:
            headers[JOB_ID_HEADER] = job_id
        timeout = httpx.Timeout(self.timeout_s, connect=10.0)
        canceled = JobFailure("canceled", "the job was canceled; engine request closed")
        if cancel is not None and cancel.is_set():
            raise canceled
        unregister = lambda: None
        try:
            with httpx.Client(timeout=timeout) as client, client.stream(
                    "POST", f"{self.url}/internal/transcribe", content=decoded.pcm_chunks(),
                    headers={**headers, "content-length": str(pcm.nbytes)}) as r:
                if cancel is not None:
                    unregister = cancel.add_callback(lambda: _shutdown(r))
                if r.status_code >= 400:
                    r.read()
                    raise _http_failure(r)
                for line in r.iter_lines():
                    if cancel is not None and cancel.is_set():
                        raise canceled  # leaving the block closes the connection: the server's cue to abort
                    if not line.strip():
                        continue
                    msg = json.loads(line)
                    kind = msg.pop("type")
                    if kind == "result":
                        result = msg["result"]
                        result.setdefault("metrics", {})["worker_decode_s"] = decode_s
                        return result
                    if kind == "error":
                        raise JobFailure(msg["code"], msg["message"], retryable=msg["code"] == "engine_error")
                    if on_event is not None:
                        on_event(kind, msg)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            # Nothing reached the engine: it is down or restarting; the job waits, no attempt spent.
            raise JobFailure("engine_unavailable", f"engine server unreachable: {e}",
                             outage=Dependency.ENGINE) from e
        except httpx.HTTPError as e:
            if cancel is not None and cancel.is_set():  # the read failed because the socket was shut down
                raise canceled from None
            raise JobFailure("engine_error", f"engine server dropped the request: {e}", retryable=True) from e
        finally:
            unregister()
        if cancel is not None and cancel.is_set():
            raise canceled
        raise JobFailure("engine_error", "engine stream ended without a result", retryable=True)

    def ready(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False


def _shutdown(response: Any) -> None:
    """Shut the response's socket down both ways: a thread blocked reading it wakes at once with EOF
    (``close`` from another thread would not wake it), and the peer sees the connection end."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass


def _http_failure(r) -> JobFailure:
    if r.status_code in (502, 503, 504):  # a proxy or the server says it is not serving: an outage
        return JobFailure("engine_unavailable", f"engine server answered {r.status_code}", outage=Dependency.ENGINE)
    try:
        err = r.json()["error"]
        return JobFailure(err["code"], err["message"], retryable=r.status_code >= 500)
    except (ValueError, KeyError, TypeError):
        return JobFailure("engine_error", f"engine server answered {r.status_code}", retryable=True)
