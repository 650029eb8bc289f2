"""The engine server (``diarist engine``): one per GPU, on loopback, the only process that loads a model.

Routes:
- ``POST /internal/transcribe`` (:mod:`engine_server.protocol`): the audio as the body (the decoded samples
  when the ``x-diarist-pcm`` header describes them, which is what workers send; else the uploaded file,
  decoded here), the options, the job's id and its admission class in headers (the class is set on every
  engine sequence of the request so that the engine admits it against its class's own limit; an unknown one
  is refused with 422 ``invalid_request``); the answer is newline-delimited JSON, one
  :mod:`diarist.contract.events` line per event, then a ``result`` or an ``error`` line. Workers consume it
  (:class:`engine_server.client.HttpEngineClient`).
- ``POST /v1/audio/transcriptions``: OpenAI-compatible, synchronous (json, text, srt, vtt, verbose_json,
  diarized_json; ``stream=true`` → ``transcript.text.delta`` … ``transcript.text.done``). A ``model`` this
  server does not serve is 422 ``unknown_model``, as on the main API; ``temperature`` and
  ``timestamp_granularities[]`` are honoured or refused as there (``api.routes.openai``).
- ``GET /health``, ``GET /stats`` (engine gauges and counters), ``GET /info`` (what this engine serves:
  model family, audio frontend, checkpoint name, random weights; :func:`engine_info`). Workers ask it
  before decoding a job (:class:`engine_server.client.HttpEngineClient`), and samples decoded with another
  frontend than this engine's are refused (409 ``frontend_mismatch``), so a worker configured for another
  family can never feed the model audio mixed its way (stereo 1.41x too loud for MOSS-TD).
- ``POST /internal/embed``: the voice vector of an enrollment sample (known speakers; the API's
  ``Services.voices`` in a split deployment), the body as for ``/internal/transcribe``.

Bad audio is a 422 with its code (``empty_audio`` for a zero-byte upload, ``decode_failed``, ...); no error
message names a file of this server (uploads are spooled to temporary files).

Many requests run at once (one thread each); the engine batches across them. A request whose client goes
away (connection closed, or the handler task cancelled) has its engine sequences aborted, which frees
their KV at once; its windows not yet submitted never reach the engine.

Logs (logger ``diarist.engine_server``): one INFO line per transcription request when it ends
(``request <id> <finish_reason>``, with the job id when a worker sent one, the audio's seconds, prompt and
output tokens, the finish reason or error code and the request's seconds; in JSON logs these are keys of
the line, :func:`log_request`), and one more per cancel (``request <id> canceled``: its client went away
and its engine work was aborted).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.responses import Response, StreamingResponse

from diarist.contract.errors import CodedError
from diarist.contract.events import ErrorLine, Line, ResultLine, make, to_line
from diarist.contract.options import MAX_TEMPERATURE, TranscribeOptions
from diarist.contract.result import TranscriptionResult
from diarist.http import errors
from diarist.http.engine_metrics import engine_metrics_router
from diarist.http.errors import ApiError, unknown_model
from diarist.logs import job_context
from diarist.pcm import PcmFormat
from engine_server.protocol import MEDIA_TYPE, read_request

log = logging.getLogger("diarist.engine_server")

CHUNK = 1 << 20
MAX_PCM_BYTES = 8 * 3600 * 16_000 * 4 * 2
"""Largest decoded body taken (bytes): 8 hours of 16 kHz float32 in two channels; a bigger header is refused
before anything is allocated."""
_END = object()


class CancelOnClose(StreamingResponse):
    """A streamed response that sets ``cancel`` however it ends: all sent, the client gone, or the task cancelled.

    Under ASGI spec < 2.4 (uvicorn's HTTP) Starlette notices ``http.disconnect`` and cancels the stream; under
    2.4 the failed send raises instead and leaves the body iterator unclosed, so the event is set here rather
    than only in the iterator's ``finally``.
    """

    def __init__(self, content: AsyncIterator[str], cancel: threading.Event, media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self.cancel = cancel

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.cancel.set()


async def set_on_disconnect(request: Request, cancel: threading.Event) -> None:
    """Set ``cancel`` once the client disconnects (ASGI ``http.disconnect``); call after the body is read."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    cancel.set()


def log_request(request_id: str, audio_s: float | None, started: float, result: TranscriptionResult | None = None,
                error: str | None = None) -> None:
    """The request's one log line (and its cancel line when it was canceled): ``audio_s`` seconds of audio
    (the result's duration wins), ``started`` its :func:`time.perf_counter` start; ``result`` when it ended
    with one, else the ``error`` code. The job id comes from the enclosing :func:`diarist.logs.job_context`."""
    seconds = time.perf_counter() - started
    m = result.metrics if result is not None else None
    finish = result.finish_reason if result is not None else "error"
    if result is not None and result.duration is not None:
        audio_s = result.duration
    fields = {"request_id": request_id, "audio_s": None if audio_s is None else round(audio_s, 3),
              "prompt_tokens": m.prompt_tokens if m else None, "output_tokens": m.output_tokens if m else None,
              "finish_reason": finish, "error": error, "seconds": round(seconds, 3)}
    audio = "?" if audio_s is None else f"{audio_s:.1f}"
    log.info("request %s %s: %s s of audio, %s output tokens, %.2f s%s", request_id, finish, audio,
             fields["output_tokens"] if fields["output_tokens"] is not None else "-", seconds,
             f" ({error})" if error else "", extra={"fields": fields})
    if finish == "abort":
        log.info("request %s canceled: its client went away; engine work aborted after %.2f s", request_id,
                 seconds, extra={"fields": {"request_id": request_id, "event": "cancel", "seconds": round(seconds, 3)}})


def _public(message: str, source: Path | Any) -> str:
    """``message`` with the path of the request's spooled upload (``source``, when a Path) replaced: a
    client never learns this server's file names."""
    return message.replace(str(source), "<upload>") if isinstance(source, Path) else message


def engine_info(engine: Any, engine_id: str) -> dict[str, Any]:
    """What ``engine`` serves, as ``GET /info`` answers: ``engine_id``, ``family`` (``engine.config.FAMILIES``),
    ``frontend`` (how uploads must be decoded for it: ``transcription.audio.Frontend``), ``model`` (the
    checkpoint's name) and ``random_weights`` (``load_format=dummy``: its transcripts are noise)."""
    from engine.config import FAMILIES

    family = engine.loaded.info["family"]
    return {"engine_id": engine_id, "family": family, "frontend": FAMILIES[family].frontend,
            "model": engine.loaded.info.get("name"), "random_weights": bool(engine.random_weights)}


def create_engine_app(engine: Any, engine_id: str = "engine", fixed_output_tokens: int | None = None,
                      served_models: Sequence[str] | None = None, spool_dir: Path | None = None) -> FastAPI:
    """An app serving ``engine`` (an ``engine.Engine`` whose loop is running).

    ``fixed_output_tokens``: benchmark-only, see :class:`transcription.transcriber.Transcriber` (raises
    ``ValueError`` unless the engine runs dummy MOSS-TD weights). ``served_models``: the names the OpenAI
    route accepts in ``model`` (``Settings.served_model_names``); None: the defaults for the engine's model
    family and checkpoint (:func:`diarist.settings.default_served_models`). ``spool_dir``: where uploaded
    media is spooled while it is transcribed (``diarist engine`` passes its :class:`diarist.scratch.Scratch`
    directory, so a killed server's spool files are swept at the next start); None: the system temp dir.
    """
    from diarist.settings import default_served_models
    from engine.request import ADMISSION_CLASSES
    from transcription.audio import DecodedAudio
    from transcription.transcriber import Transcriber

    served = list(served_models) if served_models is not None else default_served_models(
        engine.config.model, engine.config.model_path)
    tr = Transcriber(engine, fixed_output_tokens=fixed_output_tokens)
    app = FastAPI(title="Diarist engine", version="1")
    errors.install(app)
    app.include_router(engine_metrics_router(engine, engine_id))  # Prometheus /metrics

    def run(source: Path | DecodedAudio, opts: TranscribeOptions, on_event: Any, cancel: threading.Event,
            job_id: str | None = None) -> TranscriptionResult:
        """The transcription's result; raises what :meth:`Transcriber.transcribe` raises (coded errors),
        their messages without the spooled upload's path. Logs the request's line (:func:`log_request`)."""
        request_id, started = uuid.uuid4().hex[:12], time.perf_counter()
        audio_s = None if isinstance(source, Path) else source.duration
        with job_context(job_id):
            try:
                result = tr.transcribe(str(source) if isinstance(source, Path) else source, opts,
                                       on_event=on_event, should_cancel=cancel.is_set)
            except CodedError as e:  # its class and status stay; only the message loses the path
                e.message = _public(e.message, source)
                e.args = (e.message,)
                log_request(request_id, audio_s, started, error=e.code)
                raise
            except Exception as e:
                log_request(request_id, audio_s, started, error=type(e).__name__)
                raise
            log_request(request_id, audio_s, started, result)
            return result

    async def stream(source: Path | DecodedAudio, opts: TranscribeOptions, cancel: threading.Event,
                     job_id: str | None = None) -> AsyncIterator[Line]:
        """Run the transcription on its own thread; yield its events as they come, then the result or error.

        The events cross to the event loop through an asyncio queue, so a waiting request holds no
        worker thread (only the transcription itself does). Setting ``cancel`` aborts the engine work;
        leaving this generator early (closed, or cancelled while it waits) sets it.
        """
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def put(item: Any) -> None:
            loop.call_soon_threadsafe(q.put_nowait, item)

        def work() -> None:
            try:
                # each event is checked as it is made (make): a pipeline bug is caught here, not in a worker
                result = run(source, opts, lambda k, p: put(make(k, p)), cancel, job_id)
                put(ResultLine(replace(result, engine_id=engine_id)))
            except CodedError as e:
                put(ErrorLine.of(e))
            except Exception as e:  # the stream must end with a line the worker understands
                with job_context(job_id):
                    log.exception("engine request failed")  # unexpected: the one traceback of it
                put(ErrorLine("engine_error", _public(f"{type(e).__name__}: {e}", source)))
            finally:
                put(_END)
                if isinstance(source, Path):
                    source.unlink(missing_ok=True)

        threading.Thread(target=work, name="engine-request", daemon=True).start()
        try:
            while (item := await q.get()) is not _END:
                yield item
        finally:
            cancel.set()  # a no-op once the work has ended; otherwise nobody reads what it would make

    @app.post("/internal/transcribe", summary="Streamed transcription for workers (NDJSON)")
    async def internal_transcribe(request: Request, options: Annotated[str, Query()] = "{}") -> StreamingResponse:
        req = read_request(request.headers, ADMISSION_CLASSES, options)  # InvalidRequest: a 422 before any work
        if req.pcm is not None:
            source: Path | DecodedAudio = await _read_pcm(request, req.pcm)
        else:
            source = await _read_file(request)
        cancel = threading.Event()
        lines = (to_line(line) async for line in stream(source, req.options, cancel, req.job_id))
        return CancelOnClose(lines, cancel, media_type=MEDIA_TYPE)

    @app.post("/v1/audio/transcriptions", summary="OpenAI-compatible transcription")
    async def openai_transcriptions(
        request: Request, file: Annotated[UploadFile, File()], model: Annotated[str, Form()] = "whisper",
        language: Annotated[str | None, Form()] = None, prompt: Annotated[str | None, Form()] = None,
        response_format: Annotated[str, Form()] = "json", stream_: Annotated[bool, Form(alias="stream")] = False,
        temperature: Annotated[float | None, Form(ge=0, le=MAX_TEMPERATURE)] = None,
        granularities: Annotated[list[str] | None, Form(alias="timestamp_granularities[]")] = None,
        granularities_plain: Annotated[list[str] | None, Form(alias="timestamp_granularities")] = None,
    ) -> Response:
        from diarist.formats import OPENAI_FORMATS, openai_done_event, render_openai, timestamp_granularities
        from diarist.transcript import Transcript

        if model not in served:
            raise unknown_model(model, served)
        if response_format not in OPENAI_FORMATS:
            raise ApiError(422, "invalid_request", f"unsupported response_format {response_format!r}")
        granularity = timestamp_granularities([*(granularities or []), *(granularities_plain or [])],
                                              response_format, engine.loaded.info["family"])
        fd, name = tempfile.mkstemp(prefix="diarist-engine-", dir=spool_dir)
        os.close(fd)
        async with await anyio.open_file(name, "wb") as out:
            while chunk := await file.read(CHUNK):
                await out.write(chunk)
        opts = TranscribeOptions(language=language, prompt=prompt, temperature=temperature)
        cancel = threading.Event()
        if stream_:
            async def sse() -> AsyncIterator[str]:
                async for line in stream(Path(name), opts, cancel):
                    if line.type == "delta":
                        yield f"data: {json.dumps({'type': 'transcript.text.delta', 'delta': line.text})}\n\n"
                    elif isinstance(line, ResultLine):
                        done = openai_done_event(Transcript.from_engine(line.result))
                        yield f"data: {json.dumps(done, ensure_ascii=False)}\n\n"
                    elif isinstance(line, ErrorLine):
                        error = {"type": line.type, "code": line.code, "message": line.message}
                        yield f"data: {json.dumps({'type': 'error', 'error': error})}\n\n"

            return CancelOnClose(sse(), cancel, media_type="text/event-stream")
        # No response is being written while the engine works, so the disconnect is watched for here; the
        # thread is abandoned on cancellation (its engine work is aborted through ``cancel`` instead).
        watcher = asyncio.create_task(set_on_disconnect(request, cancel))
        try:
            result = await anyio.to_thread.run_sync(run, Path(name), opts, None, cancel, abandon_on_cancel=True)
        finally:
            watcher.cancel()
            cancel.set()
            Path(name).unlink(missing_ok=True)
        content, media_type, headers = render_openai(Transcript.from_engine(result), response_format, granularity)
        return Response(content, media_type=media_type, headers=headers)

    async def _read_pcm(request: Request, fmt: PcmFormat) -> DecodedAudio:
        """The decoded audio a worker sent, checked against its header (:class:`diarist.pcm.PcmFormat`) and
        against this engine's frontend (409 ``frontend_mismatch``: the worker asks ``/info`` again)."""
        if fmt.frontend and fmt.frontend != tr.frontend.value:
            raise ApiError(409, "frontend_mismatch",
                           f"the samples were decoded with the {fmt.frontend} frontend; this engine serves "
                           f"{engine.loaded.info['family']}, which hears audio through the {tr.frontend.value} "
                           f"frontend (GET /info)")
        if fmt.nbytes > MAX_PCM_BYTES:
            raise ApiError(413, "too_large", f"PCM body of {fmt.nbytes} bytes; at most {MAX_PCM_BYTES}")
        seconds = fmt.frames / fmt.sample_rate
        if seconds > tr.max_duration_s:  # refused before a byte is allocated for it
            raise ApiError(422, "too_long", f"the audio lasts {seconds:.0f} s; this engine takes at most "
                                            f"{tr.max_duration_s:g} s")
        # zero-filling gigabytes takes seconds: off the event loop, which every other stream shares
        body, n = await anyio.to_thread.run_sync(bytearray, fmt.nbytes), 0
        async for chunk in request.stream():
            if n + len(chunk) > len(body):
                raise ApiError(422, "invalid_pcm", f"PCM body longer than the header's {fmt.nbytes} bytes")
            body[n : n + len(chunk)] = chunk
            n += len(chunk)
        return DecodedAudio.from_pcm(fmt, memoryview(body)[:n] if n < len(body) else body)  # AudioError: a 422

    async def _read_file(request: Request) -> Path:
        """The uploaded media file, spooled to a temporary file (removed when its request ends)."""
        fd, name = tempfile.mkstemp(prefix="diarist-engine-", dir=spool_dir)
        os.close(fd)
        try:
            async with await anyio.open_file(name, "wb") as out:
                async for chunk in request.stream():
                    await out.write(chunk)
        except BaseException:  # the client left mid-upload (ClientDisconnect) or the task was cancelled
            Path(name).unlink(missing_ok=True)
            raise
        return Path(name)

    @app.post("/internal/embed", summary="The voice vector of an enrollment sample (one talker)")
    async def internal_embed(request: Request, max_duration_s: Annotated[float, Query(gt=0)] = 300.0) -> dict:
        """Body: decoded audio (:data:`engine_server.protocol.PCM_HEADER`), or a media file. Answers
        ``{"voice": SpeakerEmbedding JSON or null (no speech), "duration": seconds}``; the vector is never
        logged. 422 ``too_long`` past ``max_duration_s``, the decoder's codes for bad audio."""
        req = read_request(request.headers, ADMISSION_CLASSES)
        source: Path | DecodedAudio = await _read_pcm(request, req.pcm) if req.pcm is not None \
            else await _read_file(request)
        try:
            voice, duration = await anyio.to_thread.run_sync(tr.sample_voice, source, max_duration_s)
        except CodedError as e:
            e.message = _public(e.message, source)
            e.args = (e.message,)
            raise
        finally:
            if isinstance(source, Path):
                source.unlink(missing_ok=True)
        return {"voice": None if voice is None else voice.to_json(), "duration": duration}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "engine_id": engine_id}

    @app.get("/info")
    def info() -> dict:
        return engine_info(engine, engine_id)

    @app.get("/stats")
    def stats() -> dict:
        return {"engine_id": engine_id, **engine.stats()}

    return app
