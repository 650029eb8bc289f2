"""The wire between a worker (:mod:`engine_server.client`) and the engine server (:mod:`engine_server.server`),
in the one module both sides import.

``POST /internal/transcribe``: the body is the decoded audio (:class:`diarist.pcm.PcmFormat`, described by
:data:`PCM_HEADER`; without that header, a media file the server decodes), the job options travel as JSON in
:data:`OPTIONS_HEADER` (:class:`diarist.contract.options.TranscribeOptions`; ``?options=<json>`` is still
read when the header is absent), and the answer is newline-delimited JSON, one
:mod:`diarist.contract.events` line each, ending with ``result`` or ``error``. :func:`request_headers` writes
the request's headers and :func:`read_request` reads them back, checked; torch-free (the worker imports it).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from diarist.contract.errors import InvalidRequest
from diarist.contract.options import TranscribeOptions
from diarist.pcm import PcmFormat

PROTOCOL_VERSION = 1
"""Version of this wire; sent in :data:`PROTOCOL_HEADER`. A server refuses a request of another version
(a request without the header is taken as this version: both ends ship together)."""
PROTOCOL_HEADER = "x-diarist-protocol"
"""Request header carrying :data:`PROTOCOL_VERSION`."""
OPTIONS_HEADER = "x-diarist-options"
"""Request header carrying the job options as ASCII JSON; in the URL they (the prompt) would reach access logs."""
JOB_ID_HEADER = "x-diarist-job-id"
"""Request header naming the job, so the engine server's log lines about the request carry its id."""
ADMISSION_CLASS_HEADER = "x-diarist-admission-class"
"""Request header naming the job's duration class (``short``, ``long``; absent: ``default``), which the engine
server sets on every engine sequence of the request (``Sequence.admission_class``) for per-class admission."""
PCM_HEADER = "x-diarist-pcm"
"""Request header present when the body is decoded audio, not a media file: :meth:`PcmFormat.to_header`."""
MEDIA_TYPE = "application/x-ndjson"
"""Media type of the answer: one JSON object per line (:func:`diarist.contract.events.to_line`)."""


@dataclass(frozen=True)
class TranscribeRequest:
    """What the headers of one ``POST /internal/transcribe`` say: the options (their ``admission_class``
    set from its header), the layout of a decoded body (``None``: the body is a media file) and the job's id
    for the logs (``None`` when not sent)."""

    options: TranscribeOptions
    pcm: PcmFormat | None
    job_id: str | None


def request_headers(options: TranscribeOptions, pcm: PcmFormat, job_id: str | None = None) -> dict[str, str]:
    """The headers of a request whose body is the decoded audio ``pcm`` describes (``content-length``
    included: the body's exact size)."""
    headers = {"content-type": "application/octet-stream", "content-length": str(pcm.nbytes),
               PROTOCOL_HEADER: str(PROTOCOL_VERSION), PCM_HEADER: pcm.to_header(),
               OPTIONS_HEADER: json.dumps(options.to_json(), ensure_ascii=True),
               ADMISSION_CLASS_HEADER: options.admission_class}
    if job_id is not None:
        headers[JOB_ID_HEADER] = job_id
    return headers


def read_request(headers: Mapping[str, str], admission_classes: Collection[str], query_options: str = "{}"
                 ) -> TranscribeRequest:
    """The request that ``headers`` (case-insensitive, as the server gets them) describe, checked before any
    work so that a bad request is a 422 now rather than an error after its whole transcription.

    ``admission_classes``: the classes the engine knows (``engine.request.ADMISSION_CLASSES``, passed in
    so that this module stays torch-free). ``query_options``: the ``?options=`` JSON, read when
    :data:`OPTIONS_HEADER` is absent.

    Raises:
        InvalidRequest: another protocol version, an unknown admission class, options that are not JSON or
            break :meth:`TranscribeOptions.from_json`, or a PCM header :meth:`PcmFormat.from_header` refuses.
    """
    version = headers.get(PROTOCOL_HEADER, str(PROTOCOL_VERSION))
    if version != str(PROTOCOL_VERSION):
        raise InvalidRequest(f"{PROTOCOL_HEADER} {version!r}: this engine server speaks version {PROTOCOL_VERSION}",
                             code="unsupported_protocol")
    admission_class = headers.get(ADMISSION_CLASS_HEADER, "default")
    if admission_class not in admission_classes:
        raise InvalidRequest(f"admission_class must be one of {', '.join(admission_classes)}, "
                             f"not {admission_class!r}")
    try:
        raw = json.loads(headers.get(OPTIONS_HEADER) or query_options)
    except ValueError as e:
        raise InvalidRequest(f"options: {e}") from None
    options = TranscribeOptions.from_json(raw, admission_class=admission_class)
    pcm = None
    if (value := headers.get(PCM_HEADER)) is not None:
        try:
            pcm = PcmFormat.from_header(value)
        except (ValueError, TypeError) as e:
            raise InvalidRequest(f"{PCM_HEADER}: {e}") from None
    return TranscribeRequest(options, pcm, headers.get(JOB_ID_HEADER))
