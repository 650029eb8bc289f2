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

import logging
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
from diarist.contract.result import SpeakerEmbedding, TranscriptionResult
from diarist.logs import current_job_id
from diarist.outages import Dependency
from engine_server.protocol import request_headers

log = logging.getLogger("diarist.worker")

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

    def transcribe(self, audio: Path, options: TranscribeOptions, on_event: EventFn | None = None,
                   cancel: CancelSignal | None = None) -> TranscriptionResult:
        """Transcribe the file at ``audio`` with ``options`` (its ``admission_class`` included).

        Raises JobFailure (``canceled`` once ``cancel`` is set)."""

    def ready(self) -> bool: ...


class InProcessEngineClient:
    """Calls a :class:`transcription.transcriber.Transcriber` in this process (embedded mode, tests)."""

    def __init__(self, transcriber: Any) -> None:
        self.transcriber = transcriber
        self.engine_id = f"inprocess:{socket.gethostname()}:{os.getpid()}"

    def transcribe(self, audio: Path, options: TranscribeOptions, on_event: EventFn | None = None,
                   cancel: CancelSignal | None = None) -> TranscriptionResult:
        try:
            # The transcriber polls the token between stages and the engine while it decodes: aborting
            # frees the KV now instead of finishing work nobody will read.
            result = self.transcriber.transcribe(str(audio), options, on_event=on_event,
                                                 should_cancel=cancel.is_set if cancel is not None else None)
        except CodedError as e:  # bad input, a refusal (not retryable) or an engine failure (retryable)
            raise JobFailure.of(e) from e
        if cancel is not None and cancel.is_set():
            raise JobFailure("canceled", "the job was canceled; engine work aborted")
        return result

    def sample_voice(self, audio: Path, max_duration_s: float) -> tuple[SpeakerEmbedding | None, float]:
        """The enrollment sample's voice vector (:meth:`Transcriber.sample_voice`). Raises CodedError."""
        return self.transcriber.sample_voice(str(audio), max_duration_s)

    def ready(self) -> bool:
        return True


class HttpEngineClient:
    """Streams ``POST /internal/transcribe`` of a ``diarist engine`` server (newline-delimited JSON events).

    The audio is decoded here (PyAV, 16 kHz float32) and sent as samples (:class:`engine_server.protocol.PcmFormat`):
    the engine process, whose loop thread drives the GPU, then spends no CPU on FFmpeg
    (``benchmarks/results/service_gpu_h200.md``). How to decode is the engine's to say, not this process's
    settings: before each job the client asks ``GET /info`` (:meth:`info`) which model family the engine
    serves and through which frontend it hears audio (``transcription.audio.Frontend``), decodes so, and
    names the frontend in the PCM header (the engine refuses another: 409 ``frontend_mismatch``, retryable).
    ``expected_family`` (the worker's ``DIARIST_MODEL``) only draws a warning when the engine serves another.
    Undecodable audio fails here with the decoder's code, before the job reaches the engine; the result's
    ``metrics.worker_decode_s`` is the decode time (seconds).

    The last line is ``{"type": "result", "result": {...}}`` (read with :meth:`TranscriptionResult.from_json`) or ``{"type": "error", "code", "message"}``.
    A dropped connection or a 5xx is retryable (``engine_error``); the server's own codes are not.
    Once ``cancel`` is set the stream's socket is shut down from the cancelling thread, even while this
    one is blocked reading a stream with nothing to say (prefill, windows that all end at once): the
    server sees the disconnect and aborts the request's engine sequences (``engine_server.server``: closing
    the stream is the cancel signal, so a dead worker and a canceled job take the same path).
    """

    def __init__(self, url: str, timeout_s: float = 7200.0, expected_family: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.engine_id = self.url
        self.expected_family = expected_family
        self._warned: set[str] = set()

    def info(self) -> dict[str, Any]:
        """The engine's ``GET /info``: ``family``, ``frontend``, ``model``, ``random_weights``, ``engine_id``
        (``engine_server.server.engine_info``); asked before every job, so an engine restarted with another
        model is decoded for at once.

        Raises:
            JobFailure: ``engine_unavailable`` (an outage) when the engine does not answer; ``engine_error``
                (retryable) for an answer that is not an info object.
        """
        import httpx

        r = _answer(lambda: httpx.get(f"{self.url}/info", timeout=httpx.Timeout(30.0, connect=10.0)), "GET /info")
        try:
            info = r.json()
            family, frontend = str(info["family"]), str(info["frontend"])
        except (ValueError, KeyError, TypeError):
            raise JobFailure("engine_error", "engine server's GET /info is not an info object", retryable=True) from None
        if self.expected_family and family != self.expected_family and family not in self._warned:
            self._warned.add(family)
            log.warning("engine %s serves %s (frontend %s), not this worker's DIARIST_MODEL=%s: uploads are decoded "
                        "for the engine's family", self.url, family, frontend, self.expected_family)
        return info

    def transcribe(self, audio: Path, options: TranscribeOptions, on_event: EventFn | None = None,
                   cancel: CancelSignal | None = None) -> TranscriptionResult:
        import httpx

        from transcription.audio import AudioError, Frontend, decode_audio

        opts = options
        if cancel is not None and cancel.is_set():
            raise JobFailure("canceled", "the job was canceled; engine request closed")
        def decode(frontend: Frontend) -> Any:
            try:  # decoded here, on the worker's CPU: the engine process keeps its CPU for the GPU loop
                return decode_audio(audio, mono=not opts.multichannel, frontend=frontend)
            except AudioError as e:
                raise JobFailure(e.code, e.message) from e

        try:
            frontend = Frontend(self.info()["frontend"])  # the engine says how it hears audio, not our settings
        except JobFailure as e:
            if e.outage is not None:  # a file that is not audio fails now with its own code, not after the outage
                decode(Frontend.FFMPEG)
            raise
        t0 = time.perf_counter()
        if on_event is not None:  # the engine server's stream starts after the decode: its stage is told here
            on_event(Stage.type, payload(Stage("decode")))
        decoded = decode(frontend)
        decode_s = time.perf_counter() - t0
        headers = request_headers(opts, replace(decoded.pcm_format(), frontend=frontend.value), current_job_id())
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

    def sample_voice(self, audio: Path, max_duration_s: float) -> tuple[SpeakerEmbedding | None, float]:
        """The enrollment sample's voice vector from ``POST /internal/embed`` (the audio decoded here and sent
        as samples, as :meth:`transcribe` does; its duration checked here first).

        Raises:
            CodedError: the decoder's code; ``too_long``; the server's coded error; ``engine_unavailable``
                (not reachable, or 502/503/504: :class:`JobFailure` with an outage); ``engine_error``.
        """
        import httpx

        from transcription.audio import AudioError, Frontend, decode_audio

        frontend = Frontend(self.info()["frontend"])  # as transcribe: the engine says how it hears audio
        try:
            decoded = decode_audio(audio, frontend=frontend)
        except AudioError as e:
            raise JobFailure(e.code, e.message) from e
        if decoded.duration > max_duration_s:
            raise JobFailure("too_long", f"the sample lasts {decoded.duration:.0f} s; a voice sample may last at "
                                         f"most {max_duration_s:g} s")
        headers = request_headers(TranscribeOptions(), replace(decoded.pcm_format(), frontend=frontend.value))
        r = _answer(lambda: httpx.post(
            f"{self.url}/internal/embed", content=b"".join(decoded.pcm_chunks()), headers=headers,
            params={"max_duration_s": max_duration_s}, timeout=httpx.Timeout(300.0, connect=10.0)), "the request")
        try:
            body = r.json()
            voice = None if body.get("voice") is None else SpeakerEmbedding.from_json(body["voice"], "the voice")
            return voice, float(body["duration"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise JobFailure("engine_protocol", f"the engine server's voice answer is malformed: {e}") from e

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


def _answer(send: Callable[[], Any], what: str) -> Any:
    """``send()``'s response (an ``httpx.Response``) when its status is below 400, else the failure it means.

    Raises:
        JobFailure: ``engine_unavailable`` (an outage) when nothing reached the engine; ``engine_error``
            (retryable) when the engine dropped ``what``; :func:`_http_failure` for an error status.
    """
    import httpx

    try:
        r = send()
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise JobFailure("engine_unavailable", f"engine server unreachable: {e}", outage=Dependency.ENGINE) from e
    except httpx.HTTPError as e:
        raise JobFailure("engine_error", f"engine server dropped {what}: {e}", retryable=True) from e
    if r.status_code >= 400:
        raise _http_failure(r)
    return r


def _http_failure(r: Any) -> JobFailure:
    """The failure an error status of the engine server means: an outage (502/503/504), else its coded error
    (``{"error": {"code", "message"}}``; retryable when 5xx)."""
    if r.status_code in (502, 503, 504):  # a proxy or the server says it is not serving: an outage
        return JobFailure("engine_unavailable", f"engine server answered {r.status_code}", outage=Dependency.ENGINE)
    try:
        err = r.json()["error"]
        # frontend_mismatch: the engine changed model between GET /info and the job; the next attempt asks again
        return JobFailure(err["code"], err["message"],
                          retryable=r.status_code >= 500 or err["code"] == "frontend_mismatch")
    except (ValueError, KeyError, TypeError):
        return JobFailure("engine_error", f"engine server answered {r.status_code}", retryable=True)
