"""How a worker reaches the engine: in-process (embedded mode) or the engine server over loopback HTTP.

Both clients take a local audio path and job options, call ``on_event(kind, payload)`` with the engine's
streaming events (:mod:`diarist.contract.events`: ``queued``, ``started``, ``delta``, ``segment``, ``finished``)
and return the typed result (:class:`diarist.contract.result.TranscriptionResult`). Failures become :class:`JobFailure` with a
machine code; ``retryable`` says whether another attempt could succeed. A ``cancel`` signal
(:class:`CancelSignal`, e.g. ``worker.cancel.CancelToken``) stops the engine work as soon as it is set: the call then raises
:class:`JobFailure` ``canceled`` (not retryable). ``admission_class`` (``short``, ``long`` or
``default``; :func:`worker.routing.admission_class`) is set on every engine sequence of the job, so the
engine admits the job against its class's own limit.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from diarist.contract.errors import CodedError, ProtocolError
from diarist.contract.events import ErrorLine, ResultLine, Stage, from_line, payload
from diarist.contract.options import TranscribeOptions
from diarist.contract.result import TranscriptionResult
from diarist.logs import current_job_id
from diarist.outages import Dependency
from engine_server.protocol import request_headers

EventFn = Callable[[str, dict], None]
"""``on_event(kind, payload)``: a :mod:`diarist.contract.events` event's type and fields."""


class CancelSignal(Protocol):
    """What a client needs of a cancel token (``worker.cancel.CancelToken`` is one)."""

    def is_set(self) -> bool:
        """True once the job was canceled."""

    def add_callback(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` (from the cancelling thread) once set; returns a function that unregisters it."""


class JobFailure(CodedError):
    """A transcription that failed with a machine ``code`` (``decode_failed``, ``too_long``, ``engine_error``…).

    ``retryable``: another attempt could succeed (it spends one of the job's attempts). ``outage``: the
    engine server did not answer at all (refused connection, 502/503/504), so the job waits it out without
    spending an attempt (see :mod:`diarist.outages`).
    """

    def __init__(self, code: str, message: str, retryable: bool = False, outage: Dependency | None = None) -> None:
        super().__init__(code, message)
        self.retryable, self.outage = retryable or outage is not None, outage

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    @classmethod
    def of(cls, error: CodedError) -> JobFailure:
        """``error`` as a job failure, with its code, message and ``retryable``."""
        return error if isinstance(error, cls) else cls(error.code, error.message, retryable=error.retryable)


class EngineClient(Protocol):
    engine_id: str

    def transcribe(self, audio: Path, options: dict, on_event: EventFn | None = None,
                   cancel: CancelSignal | None = None, admission_class: str = "default") -> TranscriptionResult:
        """Raises JobFailure (``canceled`` once ``cancel`` is set)."""

    def ready(self) -> bool: ...


class InProcessEngineClient:
    """Calls a :class:`transcription.transcriber.Transcriber` in this process (embedded mode, tests)."""

    def __init__(self, transcriber: Any) -> None:
        self.transcriber = transcriber
        self.engine_id = f"inprocess:{socket.gethostname()}:{os.getpid()}"

    def transcribe(self, audio: Path, options: dict, on_event: EventFn | None = None,
                   cancel: CancelSignal | None = None, admission_class: str = "default") -> TranscriptionResult:
        try:
            opts = TranscribeOptions.from_json(options, admission_class=admission_class)
            # The transcriber polls the token between stages and the engine while it decodes: aborting
            # frees the KV now instead of finishing work nobody will read.
            result = self.transcriber.transcribe(str(audio), opts, on_event=on_event,
                                                 should_cancel=cancel.is_set if cancel is not None else None)
        except CodedError as e:  # bad input, a refusal (not retryable) or an engine failure (retryable)
            raise JobFailure.of(e) from e
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

    The last line is ``{"type": "result", "result": {...}}`` (read with :meth:`TranscriptionResult.from_json`) or ``{"type": "error", "code", "message"}``.
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
                   cancel: CancelSignal | None = None, admission_class: str = "default") -> TranscriptionResult:
        import httpx

        from transcription.audio import AudioError, Frontend, decode_audio

        try:
            opts = TranscribeOptions.from_json(options, admission_class=admission_class)
        except CodedError as e:
            raise JobFailure.of(e) from e
        if cancel is not None and cancel.is_set():
            raise JobFailure("canceled", "the job was canceled; engine request closed")
        t0 = time.perf_counter()
        if on_event is not None:  # the engine server's stream starts after the decode: its stage is told here
            on_event(Stage.type, payload(Stage("decode")))
        try:  # decoded here, on the worker's CPU: the engine process keeps its CPU for the GPU loop
            decoded = decode_audio(audio, mono=not opts.multichannel,
                                   frontend=Frontend.for_family(self.family))
        except AudioError as e:
            raise JobFailure(e.code, e.message) from e
        decode_s = time.perf_counter() - t0
        headers = request_headers(opts, decoded.pcm_format(), current_job_id())
        timeout = httpx.Timeout(self.timeout_s, connect=10.0)
        canceled = JobFailure("canceled", "the job was canceled; engine request closed")
        if cancel is not None and cancel.is_set():
            raise canceled
        unregister = lambda: None
        try:
            with httpx.Client(timeout=timeout) as client, client.stream(
                    "POST", f"{self.url}/internal/transcribe", content=decoded.pcm_chunks(), headers=headers) as r:
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
                    msg = from_line(line)  # ProtocolError: a line that breaks the contract
                    if isinstance(msg, ResultLine):
                        return replace(msg.result, pipeline_metrics={**msg.result.pipeline_metrics,
                                                                     "worker_decode_s": decode_s})
                    if isinstance(msg, ErrorLine):
                        raise JobFailure(msg.code, msg.message, retryable=msg.code == "engine_error")
                    if on_event is not None:
                        on_event(msg.type, payload(msg))
        except ProtocolError as e:
            raise JobFailure.of(e) from e
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


def _http_failure(r: Any) -> JobFailure:
    """The failure an error status of the engine server means: an outage (502/503/504), else its coded error
    (``{"error": {"code", "message"}}``; retryable when 5xx)."""
    if r.status_code in (502, 503, 504):  # a proxy or the server says it is not serving: an outage
        return JobFailure("engine_unavailable", f"engine server answered {r.status_code}", outage=Dependency.ENGINE)
    try:
        err = r.json()["error"]
        return JobFailure(err["code"], err["message"], retryable=r.status_code >= 500)
    except (ValueError, KeyError, TypeError):
        return JobFailure("engine_error", f"engine server answered {r.status_code}", retryable=True)
