"""A synchronous client's wait for its job (the OpenAI-compatible route): the deadline, and the client leaving.

The route turns a request into an ordinary job and holds the HTTP request open until the job is final. Two
things end the wait early, and each has one rule here:

- **The deadline** (``Settings.sync_timeout_s``): 504 ``timeout`` naming the job, which keeps running; the
  client fetches it later from ``GET /v1/jobs/{id}`` (:func:`sync_timeout`).
- **The client disconnects** (ASGI ``http.disconnect``): nobody will read the answer, so the job is
  canceled with the transition ``DELETE /v1/jobs/{id}`` uses (:func:`diarist.jobs.cancel`), and the
  engine stops working on it (the worker's cancel watch, docs/service.md "Cancellation reaches the
  engine"). The request then ends as 499 ``client_closed_request`` (nginx's status for it), which only
  the request metrics and logs see.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

import anyio
from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from diarist import jobs
from diarist.http.errors import ApiError
from diarist.services import Services

log = logging.getLogger("diarist.api")
T = TypeVar("T")

_END = object()
CLIENT_CLOSED = 499
"""Status of a request whose client went away before the answer (nginx's convention; never received)."""


def sync_timeout(job_id: str, seconds: float) -> ApiError:
    """504 ``timeout``: the job did not finish within ``seconds``; it goes on, and the message says where to
    fetch it."""
    return ApiError(504, "timeout", f"the transcription did not finish within {seconds:g} s; job {job_id} "
                    f"goes on: poll GET /v1/jobs/{job_id} and fetch GET /v1/jobs/{job_id}/transcript once it "
                    "is completed")


def abandon(services: Services, job_id: str) -> bool:
    """The client left: cancel the job (``queued|processing → canceled``). False when it was final already."""
    canceled = jobs.cancel(services, job_id)
    if canceled:
        log.info("job %s canceled: its synchronous client disconnected", job_id)
    return canceled


async def _disconnect(request: Request) -> None:
    """Return once the client has disconnected. The body must have been read already: every message that
    arrives after it is ``http.disconnect`` (ASGI HTTP spec), so this waits without polling."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_unless_gone(request: Request, services: Services, job_id: str, wait: Callable[[], T]) -> T:
    """``wait()`` (blocking, run on a worker thread) while watching the client.

    Returns what ``wait`` returns, and raises what it raises. When the client disconnects first, the job is
    canceled (:func:`abandon`), ``wait`` is let finish (it waits for the job's final state, so it ends
    within a poll of the row) and :class:`ApiError` ``CLIENT_CLOSED`` is raised.
    """
    work = asyncio.ensure_future(run_in_threadpool(wait))
    # should this request itself be cancelled (server shutdown), the thread's outcome is read by nobody
    work.add_done_callback(lambda f: f.cancelled() or f.exception())
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if work.done():  # an answer that is ready is sent, even if the client is leaving at the same moment
        return work.result()
    await run_in_threadpool(abandon, services, job_id)
    with contextlib.suppress(Exception):  # ends within a poll now that the job is final; its answer is unread
        await work
    raise ApiError(CLIENT_CLOSED, "client_closed_request", f"the client disconnected; job {job_id} was canceled")


async def stream_unless_gone(services: Services, job_id: str, chunks: Iterator[str],
                             on_close: Callable[[], None]) -> AsyncIterator[str]:
    """``chunks`` (a blocking iterator, advanced on worker threads) as a response body.

    A body that ends before ``chunks`` is exhausted (the client disconnected and Starlette cancelled the
    stream, or an error) cancels the job (:func:`abandon`): an exhausted one has sent its final event.
    ``on_close`` runs however it ends (the subscription's close).
    """
    finished = False
    try:
        # abandon_on_cancel: a cancelled stream stops at once, not when the thread's wait for the job's next
        # event ends; that thread ends by itself once the job is final (canceled below)
        while (chunk := await anyio.to_thread.run_sync(next, chunks, _END, abandon_on_cancel=True)) is not _END:
            yield chunk
        finished = True
    finally:
        try:
            if not finished:
                with anyio.CancelScope(shield=True):  # the stream's task is being cancelled: finish this first
                    await run_in_threadpool(abandon, services, job_id)
        finally:
            on_close()  # after the cancel's event went out: the abandoned thread may still be reading it
